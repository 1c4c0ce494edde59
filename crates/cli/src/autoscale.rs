//! `cloudweb autoscale APP`: an app's autoscaling. With `--min`, `--max`
//! and a target (`--cpu PERCENT` or `--rps N`) it turns autoscaling on or
//! changes it; `--off` turns it off; with neither it shows the settings
//! and the autoscaler's newest decisions.

use clap::Args;
use cloudweb_api_types::autoscale::{Autoscale, AutoscaleTarget, AutoscaleView};
use reqwest::Method;

use crate::client::{segment, Api};
use crate::render::{self, clean, table};
use crate::Failure;

#[derive(Args)]
pub struct AutoscaleArgs {
    app: String,
    /// Fewest instances (1 to 20).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=20), requires = "max")]
    min: Option<u32>,
    /// Most instances (min to 20).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=20), requires = "min")]
    max: Option<u32>,
    /// Keep the instances' average CPU near this percentage of the cores
    /// each requests (1 to 1000).
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u32).range(1..=1000), conflicts_with = "rps")]
    cpu: Option<u32>,
    /// Keep the requests per second per instance (through the ingress)
    /// near this (1 to 100000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rps: Option<u32>,
    /// Seconds every look must ask for more before scaling up (0 to 3600).
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u32).range(0..=3600))]
    up_window: u32,
    /// Seconds every look must ask for fewer before scaling down (0 to
    /// 86400).
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u32).range(0..=86_400))]
    down_window: u32,
    /// Turn autoscaling off (the app keeps its count).
    #[arg(long, conflicts_with_all = ["min", "max", "cpu", "rps"])]
    off: bool,
}

/// The settings the flags give, if they give any.
fn settings(args: &AutoscaleArgs) -> Result<Option<Autoscale>, Failure> {
    let target = match (args.cpu, args.rps) {
        (Some(p), _) => Some(AutoscaleTarget::CpuPercent(p)),
        (_, Some(r)) => Some(AutoscaleTarget::RequestsPerSecond(r)),
        _ => None,
    };
    match (args.min, args.max, target) {
        (None, None, None) => Ok(None),
        (Some(min), Some(max), Some(target)) => {
            let settings = Autoscale { min, max, target, up_window_seconds: args.up_window, down_window_seconds: args.down_window };
            match settings.problem() {
                Some(problem) => Err(Failure::Usage(problem)),
                None => Ok(Some(settings)),
            }
        }
        _ => Err(Failure::Usage("autoscaling needs --min, --max and a target (--cpu PERCENT or --rps N)".into())),
    }
}

pub async fn run(api: &Api, args: AutoscaleArgs, json: bool) -> Result<(), Failure> {
    let path = format!("/api/apps/{}/autoscale", segment(&args.app));
    let view: AutoscaleView = if args.off {
        api.call(Method::DELETE, &path, None::<&()>).await?
    } else {
        match settings(&args)? {
            Some(settings) => api.call(Method::PUT, &path, Some(&settings)).await?,
            None => api.get(&path).await?,
        }
    };
    if json {
        render::json(&view);
        return Ok(());
    }
    let name = clean(&view.app);
    match &view.autoscale {
        None => println!("{name}: autoscaling off; {} instance(s)", view.instances),
        Some(a) => {
            let target = match a.target {
                AutoscaleTarget::CpuPercent(p) => format!("CPU {p}% of the requested cores"),
                AutoscaleTarget::RequestsPerSecond(r) => format!("{r} requests/s per instance"),
            };
            println!(
                "{name}: {}–{} instances near {target} (up after {} s, down after {} s); {} instance(s) now",
                a.min, a.max, a.up_window_seconds, a.down_window_seconds, view.instances
            );
        }
    }
    if !view.decisions.is_empty() {
        let rows: Vec<Vec<String>> = view
            .decisions
            .iter()
            .map(|d| vec![clean(&d.at), format!("{} -> {}", d.from, d.to), d.value.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into()), clean(&d.reason)])
            .collect();
        table(&["AT", "COUNT", "VALUE", "REASON"], &rows);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::{Cli, Command};

    fn parse(args: &[&str]) -> Result<Option<serde_json::Value>, String> {
        let cli = Cli::try_parse_from(["cloudweb", "autoscale"].iter().chain(args)).map_err(|e| e.to_string())?;
        let Command::Autoscale(args) = cli.command else { unreachable!() };
        super::settings(&args).map(|s| s.map(|s| serde_json::to_value(s).unwrap())).map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn flags_make_the_settings_or_are_refused() {
        assert_eq!(parse(&["web"]).unwrap(), None);
        assert_eq!(
            parse(&["web", "--min", "2", "--max", "6", "--cpu", "70"]).unwrap(),
            Some(serde_json::json!({"min": 2, "max": 6, "target": {"cpu_percent": 70}, "up_window_seconds": 60, "down_window_seconds": 300}))
        );
        assert_eq!(parse(&["web", "--min", "1", "--max", "3", "--rps", "50", "--down-window", "60"]).unwrap().unwrap()["target"], serde_json::json!({"requests_per_second": 50}));
        for bad in [&["web", "--min", "2"][..], &["web", "--min", "3", "--max", "2", "--cpu", "50"], &["web", "--min", "1", "--max", "2"], &["web", "--off", "--min", "1", "--max", "2"], &["web", "--cpu", "50", "--rps", "5", "--min", "1", "--max", "2"], &["web", "--min", "0", "--max", "2", "--cpu", "5"]] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
