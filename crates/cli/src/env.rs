//! `cloudweb env`: an app's environment variables (their names; values
//! are write-only).

use std::collections::BTreeMap;

use clap::Subcommand;
use cloudweb_api_types::apps::{AppView, EnvPatch, EnvView};
use reqwest::Method;

use crate::client::{segment, Api};
use crate::login::read_secret;
use crate::render::{self, cell, clean};
use crate::Failure;

#[derive(Subcommand)]
pub enum EnvCommand {
    /// The variables' names.
    List { app: String },
    /// Set variables: NAME=VALUE, or NAME alone to read its value from
    /// stdin (keeps it out of the process list). Used by the next deploy.
    Set {
        app: String,
        #[arg(required = true, value_name = "NAME[=VALUE]")]
        vars: Vec<String>,
    },
    /// Remove variables.
    Unset {
        app: String,
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
}

/// An environment variable name: a letter or `_`, then letters, digits
/// and `_`.
pub fn env_name(name: &str) -> Result<(), Failure> {
    let mut bytes = name.bytes();
    let valid = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 256;
    if valid {
        Ok(())
    } else {
        Err(Failure::Usage(format!("invalid variable name {:?}: use letters, digits and '_', not starting with a digit", clean(name))))
    }
}

pub async fn run(api: &Api, command: EnvCommand, json: bool) -> Result<(), Failure> {
    let (app, body) = match command {
        EnvCommand::List { app } => {
            let view: AppView = api.get(&format!("/api/apps/{}", segment(&app))).await?;
            if json {
                render::json(&view.env);
            } else {
                for name in &view.env {
                    println!("{}", cell(name));
                }
            }
            return Ok(());
        }
        EnvCommand::Set { app, vars } => {
            let mut set = BTreeMap::new();
            let mut from_stdin = None;
            for var in vars {
                match var.split_once('=') {
                    Some((name, value)) => {
                        env_name(name)?;
                        set.insert(name.to_string(), value.to_string());
                    }
                    None => {
                        env_name(&var)?;
                        if from_stdin.replace(var.clone()).is_some() {
                            return Err(Failure::Usage("only one variable can take its value from stdin".into()));
                        }
                    }
                }
            }
            if let Some(name) = from_stdin {
                let value = read_secret(&format!("value of {name}: "))?;
                set.insert(name, value.trim_end_matches(['\r', '\n']).to_string());
            }
            (app, EnvPatch { set, unset: Vec::new() })
        }
        EnvCommand::Unset { app, names } => {
            for name in &names {
                env_name(name)?;
            }
            (app, EnvPatch { set: BTreeMap::new(), unset: names })
        }
    };
    let answer: EnvView = api.call(Method::PATCH, &format!("/api/apps/{}/env", segment(&app)), Some(&body)).await?;
    if json {
        render::json(&answer.env);
    } else {
        println!("{} now has: {} (used by the next deploy)", clean(&app), cell(&answer.env));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(env_name("DATABASE_URL").is_ok());
        assert!(env_name("_X1").is_ok());
        assert!(matches!(env_name("1X"), Err(Failure::Usage(_))));
        assert!(matches!(env_name("A-B"), Err(Failure::Usage(_))));
    }
}
