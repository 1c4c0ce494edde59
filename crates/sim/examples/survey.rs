//! `cargo run -p cloudweb-sim --example survey -- FIRST COUNT [settled|every] [nopin]`:
//! counts failing seeds by invariant.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let first: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let count: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100);
    let every = args.get(3).map(String::as_str) != Some("settled");
    let pin = args.get(4).map(String::as_str) != Some("nopin");
    let started = std::time::Instant::now();
    let survey = cloudweb_sim::survey(first, count, |seed| {
        let mut o = cloudweb_sim::Options::new(seed);
        o.check_every_step = every;
        o.pin_commits = pin;
        if let Ok(k) = std::env::var("KILLS") { o.kills = k.parse().unwrap(); }
        if let Ok(k) = std::env::var("STEPS") { o.steps = k.parse().unwrap(); }
        o
    });
    println!("{} runs, {} kills, {} deployments, {:.1} s", survey.runs, survey.kills, survey.deployments, started.elapsed().as_secs_f64());
    for (invariant, seeds) in &survey.failures {
        println!("{invariant}: {} seeds, first {:?}", seeds.len(), &seeds[..seeds.len().min(10)]);
    }
    if let Some(first) = survey.first {
        println!("{first}");
    }
}
