//! `cloudweb volumes`: list volumes, mount one in an app, detach one, and
//! delete one (its data) by name.

use std::io::{BufRead, IsTerminal};

use clap::Subcommand;
use cloudweb_api_types::volumes::{AttachVolume, VolumeList, VolumeView};
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
