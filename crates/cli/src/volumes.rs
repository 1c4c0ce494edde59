//! `cloudweb volumes`: list volumes, mount one in an app, detach one, and
//! delete one (its data) by name.

use std::io::{BufRead, IsTerminal};

use clap::Subcommand;
use cloudweb_api_types::volumes::{AttachVolume, MoveVolume, VolumeList, VolumeMoveList, VolumeMoveView, VolumeView};
use reqwest::Method;
use serde_json::json;

use crate::client::{segment, Api};
use crate::render::{self, cell, clean, table};
use crate::Failure;

#[derive(Subcommand)]
pub enum VolumesCommand {
    /// Every volume, or one app's.
    #[command(visible_alias = "ls")]
    List {
        /// Only this app's volumes.
        app: Option<String>,
    },
    /// Mount a volume in an app from its next deploy on: a new, empty one,
    /// or a detached one with its data. The app then runs on the node that
    /// holds the volume.
    Add {
        app: String,
        volume: String,
        /// Absolute path inside the app's containers.
        #[arg(long)]
        path: String,
    },
    /// Unmount a volume from an app from its next deploy on; the data stays
    /// and the volume is listed as detached.
    Detach { app: String, volume: String },
    /// Copy a volume's data to another node over the mesh (checked file by
    /// file), then restart its app there. The app keeps running until the
    /// last pass; the old copy stays on the old node until `confirm-move`
    /// or the keep period ends.
    Move {
        volume: String,
        /// The target node (name or id); the ready node with the most free
        /// disk when absent.
        #[arg(long)]
        to: Option<String>,
        /// Return once the move started instead of following it.
        #[arg(long)]
        no_wait: bool,
    },
    /// A volume's moves, newest first.
    Moves { volume: String },
    /// Delete the copy a finished move left on the old node, now.
    ConfirmMove { move_id: String },
    /// Delete a detached volume and all its data on its node.
    Rm {
        volume: String,
        /// Do not ask (needed when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

fn row(volume: &VolumeView) -> Vec<String> {
    let node = volume.node_name.clone().or_else(|| volume.node_id.clone());
    vec![
        cell(&volume.name),
        cell(&volume.state),
        cell(&volume.app),
        cell(&volume.path),
        node.map_or_else(|| "(next deploy)".to_string(), |n| cell(&n)),
        render::bytes(volume.size_bytes.map(|b| b.max(0) as u64)),
    ]
}

pub async fn run(api: &Api, command: VolumesCommand, json: bool) -> Result<(), Failure> {
    match command {
        VolumesCommand::List { app } => {
            let path = match &app {
                Some(app) => format!("/api/apps/{}/volumes", segment(app)),
                None => "/api/volumes".to_string(),
            };
            let list: VolumeList = api.get(&path).await?;
            if json {
                render::json(&list.volumes);
            } else {
                let rows: Vec<Vec<String>> = list.volumes.iter().map(row).collect();
                table(&["VOLUME", "STATE", "APP", "PATH", "NODE", "SIZE"], &rows);
            }
        }
        VolumesCommand::Add { app, volume, path } => {
            cloudweb_protocol::volumes::name(&volume).map_err(|e| Failure::Usage(e.to_string()))?;
            cloudweb_protocol::volumes::mount_path(&path).map_err(|e| Failure::Usage(e.to_string()))?;
            let body = AttachVolume { name: volume, path };
            let view: VolumeView = api.call(Method::POST, &format!("/api/apps/{}/volumes", segment(&app)), Some(&body)).await?;
            if json {
                render::json(&view);
            } else {
                let at = view.path.as_deref().unwrap_or("");
                println!("volume {} mounted at {} in {}; the next deploy uses it", cell(&view.name), clean(at), clean(&app));
            }
        }
        VolumesCommand::Detach { app, volume } => {
            api.delete(&format!("/api/apps/{}/volumes/{}", segment(&app), segment(&volume))).await?;
            if json {
                render::json(&json!({"detached": volume, "app": app}));
            } else {
                println!("volume {} detached from {} (its data stays); the next deploy runs without it", clean(&volume), clean(&app));
            }
        }
        VolumesCommand::Move { volume, to, no_wait } => {
            cloudweb_protocol::volumes::name(&volume).map_err(|e| Failure::Usage(e.to_string()))?;
            let body = MoveVolume { to };
            let started: VolumeMoveView = api.call(Method::POST, &format!("/api/volumes/{}/move", segment(&volume)), Some(&body)).await?;
            if no_wait {
                if json {
                    render::json(&started);
                } else {
                    println!("moving volume {} to {} ({}); follow it with `cloudweb volumes moves {}`", cell(&volume), target(&started), cell(&started.id), clean(&volume));
                }
                return Ok(());
            }
            let finished = follow(api, &started, json).await?;
            if json {
                render::json(&finished);
            }
            if finished.state == "failed" {
                return Err(Failure::Action(format!("the move failed: {}; the volume stays on {}", clean(finished.reason.as_deref().unwrap_or("no reason given")), node_of(&finished))));
            }
        }
        VolumesCommand::Moves { volume } => {
            let list: VolumeMoveList = api.get(&format!("/api/volumes/{}/moves", segment(&volume))).await?;
            if json {
                render::json(&list.moves);
            } else {
                let rows: Vec<Vec<String>> = list
                    .moves
                    .iter()
                    .map(|m| {
                        vec![
                            cell(&m.id),
                            cell(&m.state),
                            node_of(m),
                            target(m),
                            render::bytes(m.bytes.map(|b| b.max(0) as u64)),
                            m.downtime_ms.map_or_else(|| "-".to_string(), |d| format!("{:.1} s", d as f64 / 1000.0)),
                            cell(&m.source_copy),
                            cell(&m.reason),
                        ]
                    })
                    .collect();
                table(&["MOVE", "STATE", "FROM", "TO", "BYTES", "DOWNTIME", "OLD COPY", "REASON"], &rows);
            }
        }
        VolumesCommand::ConfirmMove { move_id } => {
            cloudweb_protocol::volume_moves::move_id(&move_id).map_err(|e| Failure::Usage(e.to_string()))?;
            let view: VolumeMoveView = api.call(Method::POST, &format!("/api/volume-moves/{}/confirm", segment(&move_id)), None::<&()>).await?;
            if json {
                render::json(&view);
            } else {
                println!("the old copy of volume {} on {} is being deleted", cell(&view.volume), node_of(&view));
            }
        }
        VolumesCommand::Rm { volume, yes } => {
            if !yes {
                if !std::io::stdin().is_terminal() {
                    return Err(Failure::Usage(format!("deleting volume {} needs --yes when stdin is not a terminal", clean(&volume))));
                }
                eprint!("Delete volume {} and all its data? Type its name to confirm: ", clean(&volume));
                let mut answer = String::new();
                std::io::stdin().lock().read_line(&mut answer).map_err(|e| Failure::Action(format!("cannot read stdin: {e}")))?;
                if answer.trim() != volume {
                    return Err(Failure::Action("not confirmed; nothing deleted".into()));
                }
            }
            api.delete(&format!("/api/volumes/{}", segment(&volume))).await?;
            if json {
                render::json(&json!({"deleted": volume}));
            } else {
                println!("volume {} deleted; its node removes the data", clean(&volume));
            }
        }
    }
    Ok(())
}

fn node_of(view: &VolumeMoveView) -> String {
    cell(&view.from_node_name.clone().unwrap_or_else(|| view.from_node_id.clone()))
}

fn target(view: &VolumeMoveView) -> String {
    cell(&view.to_node_name.clone().unwrap_or_else(|| view.to_node_id.clone()))
}

/// Follows a move until it is done or failed, printing each state once
/// (bounded by the copy's own deadline plus a margin).
async fn follow(api: &Api, started: &VolumeMoveView, json: bool) -> Result<VolumeMoveView, Failure> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2 * 3600);
    let mut last = String::new();
    loop {
        let view: VolumeMoveView = api.get(&format!("/api/volume-moves/{}", segment(&started.id))).await?;
        if view.state != last && !json {
            match view.state.as_str() {
                "copying" => println!("copying volume {} from {} to {} ({}); the app keeps running", cell(&view.volume), node_of(&view), target(&view), cell(&view.id)),
                "switched" => println!("copied and checked ({} files); the volume is on {} now; its app is starting there", view.files.unwrap_or(0), target(&view)),
                "done" => match (&view.reason, view.downtime_ms) {
                    (Some(reason), _) => println!("moved, but: {}", clean(reason)),
                    (None, Some(downtime)) => println!(
                        "done: the app runs on {} after {:.1} s of downtime; the old copy stays on {} until {} (`cloudweb volumes confirm-move {}` deletes it now)",
                        target(&view), downtime as f64 / 1000.0, node_of(&view), cell(&view.keep_until), cell(&view.id)
                    ),
                    (None, None) => println!("done: the volume is on {}; the old copy stays on {} until {}", target(&view), node_of(&view), cell(&view.keep_until)),
                },
                _ => {}
            }
            last = view.state.clone();
        }
        if matches!(view.state.as_str(), "done" | "failed") {
            return Ok(view);
        }
        if std::time::Instant::now() > deadline {
            return Err(Failure::Action(format!("move {} has not finished; follow it with `cloudweb volumes moves {}`", cell(&view.id), clean(&view.volume))));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}
