//! The measuring side of `cloudweb-bench mesh`: a sink thread in side b's
//! namespace, a client thread in side a's (both entered with setns(2)),
//! bulk TCP transfers (one stream at a time) and a stream of 64-byte round
//! trips per path and round, and what the tunnels' processes and the
//! kernel's UDP sockets did meanwhile.
//!
//! A round's bulk transfer is cut into slices of [`SLICE`], taken in turn
//! over every path (a new connection each), so that paths measured in the
//! same round see the same load from whatever else the machine runs: on a
//! shared machine that load moves by more in a few seconds than the
//! difference the target is about.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path as FsPath;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub const SINK_PORT: u16 = 5201;
pub const MESSAGE: usize = 64;
/// One bulk transfer of a round.
pub const SLICE: Duration = Duration::from_millis(500);

/// One way from side a to side b.
#[derive(Clone, Debug)]
pub struct Path {
    pub name: &'static str,
    pub to: SocketAddr,
    /// Processes that carry this path's packets (the wireguard-go pair),
    /// whose CPU time during its bulk transfer is counted.
    pub daemons: Vec<u32>,
}

/// One round's figures for one path.
pub struct Sample {
    pub bytes_per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// Datagrams both namespaces dropped for a full UDP receive buffer
    /// during the bulk transfer.
    pub udp_drops: Option<u64>,
    /// CPU seconds of `daemons` per gigabyte moved, during the transfer.
    pub cpu_per_gb: Option<f64>,
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
    // sched_setaffinity only touch it and this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Moves the calling thread into namespace `name`.
pub fn enter(name: &str) -> Result<()> {
    let file = File::open(FsPath::new("/var/run/netns").join(name)).with_context(|| format!("opening namespace {name}"))?;
    // SAFETY: setns only reads the descriptor; it changes this thread alone.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// `Udp: RcvbufErrors` of the network namespace of process `pid`
/// (/proc/<pid>/net/snmp): datagrams the kernel dropped because a socket's
/// receive buffer was full.
pub fn udp_rcvbuf_errors(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/snmp")).ok()?;
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let at = names.split_whitespace().position(|n| n == "RcvbufErrors")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// User + system CPU seconds of process `pid`, all its threads.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (in parentheses): state is field 3, utime 14
    // and stime 15.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

/// Accepts connections in `ns` until told to quit: `T` streams are read
/// to the end and answered with the byte count, `L` streams are echoed.
fn sink(ns: String, cpu: Option<usize>, ready: std::sync::mpsc::Sender<Result<()>>) {
    let entered = enter(&ns).and_then(|_| cpu.map_or(Ok(()), pin));
    let listener = match entered.and_then(|_| TcpListener::bind(("0.0.0.0", SINK_PORT)).context("binding the sink")) {
        Ok(listener) => {
            let _ = ready.send(Ok(()));
            listener
        }
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        let mut mode = [0u8];
        if stream.read_exact(&mut mode).is_err() {
            continue;
        }
        match mode[0] {
            b'T' => {
                let mut buffer = vec![0u8; 256 * 1024];
                let mut total: u64 = 0;
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                let _ = stream.write_all(&total.to_be_bytes());
            }
            b'L' => {
                let mut message = [0u8; MESSAGE];
                while stream.read_exact(&mut message).is_ok() {
                    if stream.write_all(&message).is_err() {
                        break;
                    }
                }
            }
            _ => return,
        }
    }
}

fn connect(to: SocketAddr) -> Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&to, Duration::from_secs(5)).with_context(|| format!("connecting to {to}"))?;
    stream.set_nodelay(true)?;
    // A path that stops carrying (its tunnel gone on Ctrl-C) fails the
    // measurement instead of holding it up.
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_write_timeout(Some(Duration::from_secs(30)))?;
    Ok(stream)
}

/// Bytes the receiver counted, and the seconds from the first byte sent
/// to its count.
fn throughput(to: SocketAddr, length: Duration) -> Result<(u64, f64)> {
    let mut stream = connect(to)?;
    stream.write_all(b"T")?;
    let buffer = vec![0x5au8; 128 * 1024];
    let start = Instant::now();
    while start.elapsed() < length {
        stream.write_all(&buffer)?;
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut count = [0u8; 8];
    stream.read_exact(&mut count).context("reading the receiver's count")?;
    Ok((u64::from_be_bytes(count), start.elapsed().as_secs_f64()))
}

/// Round-trip times of `pings` 64-byte messages, sorted.
fn latency(to: SocketAddr, pings: u64) -> Result<Vec<Duration>> {
    let mut stream = connect(to)?;
    stream.write_all(b"L")?;
    let mut message = [0x5au8; MESSAGE];
    let mut times = Vec::with_capacity(pings as usize);
    for _ in 0..pings {
        let start = Instant::now();
        stream.write_all(&message)?;
        stream.read_exact(&mut message)?;
        times.push(start.elapsed());
    }
    times.sort();
    Ok(times)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// How the rounds run.
pub struct Plan {
    /// Namespaces of side a (the sender) and side b (the sink).
    pub ns: [String; 2],
    /// A process in each of them (for their UDP counters).
    pub ns_pids: [u32; 2],
    /// CPUs for side a and side b, when each side has one of its own.
    pub cpus: Option<[usize; 2]>,
    pub seconds: u64,
    pub rounds: u64,
    pub pings: u64,
    /// Set when the bench is interrupted: the rounds stop at the next
    /// transfer.
    pub stop: Arc<AtomicBool>,
}

/// Every round over every path: `paths[0]` (plain) first, then the others
/// in their order in even rounds and in the reverse order in odd ones,
/// first the bulk slices in turn, then the round trips. Samples by path,
/// then round.
///
/// A path measured right after itself would find its wireguard-go's
/// threads awake, which is worth 10 to 15 % over a slice here (seen when
/// one tunnel was measured as two neighbouring paths): the order never
/// puts a tunnel next to itself, and with two tunnels each follows the
/// plain path in every other round.
pub fn rounds(plan: Plan, paths: Vec<Path>) -> Result<Vec<Vec<Sample>>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let sink_ns = plan.ns[1].clone();
    let sink_cpu = plan.cpus.map(|c| c[1]);
    std::thread::spawn(move || sink(sink_ns, sink_cpu, ready_tx));
    ready_rx.recv().context("the sink thread")??;
    std::thread::spawn(move || -> Result<Vec<Vec<Sample>>> {
        enter(&plan.ns[0])?;
        if let Some(cpus) = plan.cpus {
            pin(cpus[0])?;
        }
        let result = client(&plan, &paths);
        // Stop the sink, whatever happened.
        let _ = connect(paths[0].to).and_then(|mut s| Ok(s.write_all(b"Q")?));
        result
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the measuring thread panicked"))?
}

fn client(plan: &Plan, paths: &[Path]) -> Result<Vec<Vec<Sample>>> {
    let go_on = || if plan.stop.load(Ordering::SeqCst) { bail!("interrupted") } else { Ok(()) };
    // The first packets over a tunnel start its handshake: warm up.
    for path in paths {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            go_on()?;
            match latency(path.to, 50) {
                Ok(_) => break,
                Err(err) if Instant::now() > deadline => return Err(err.context(format!("warming up {}", path.name))),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
    let drops = || -> Option<u64> { Some(udp_rcvbuf_errors(plan.ns_pids[0])? + udp_rcvbuf_errors(plan.ns_pids[1])?) };
    let cpu = |pids: &[u32]| -> Option<f64> { pids.iter().map(|&pid| cpu_seconds(pid)).sum() };
    let slices = (plan.seconds as u128 * 1000).div_ceil(SLICE.as_millis()).max(1);
    let mut per_path: Vec<Vec<Sample>> = paths.iter().map(|_| Vec::new()).collect();
    for round in 0..plan.rounds as usize {
        let mut order: Vec<usize> = (1..paths.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        order.insert(0, 0);
        // Per path: bytes, seconds, dropped datagrams, daemon CPU seconds.
        let mut bulk: Vec<(u64, f64, Option<u64>, Option<f64>)> = paths.iter().map(|_| (0, 0.0, Some(0), Some(0.0))).collect();
        for _ in 0..slices {
            for &i in &order {
                go_on()?;
                let path = &paths[i];
                let (drops_before, cpu_before) = (drops(), cpu(&path.daemons));
                let (bytes, elapsed) = throughput(path.to, SLICE).with_context(|| format!("bulk transfer over {}", path.name))?;
                let sum = &mut bulk[i];
                sum.0 += bytes;
                sum.1 += elapsed;
                sum.2 = sum.2.zip(drops().zip(drops_before)).map(|(total, (after, before))| total + after.saturating_sub(before));
                sum.3 = sum.3.zip(cpu(&path.daemons).zip(cpu_before)).map(|(total, (after, before))| total + after - before);
            }
        }
        for &i in &order {
            let path = &paths[i];
            let (bytes, elapsed, udp_drops, cpu) = bulk[i];
            let cpu_per_gb = cpu.filter(|_| !path.daemons.is_empty() && bytes > 0).map(|cpu| cpu / (bytes as f64 / 1e9));
            go_on()?;
            let times = latency(path.to, plan.pings).with_context(|| format!("round trips over {}", path.name))?;
            per_path[i].push(Sample {
                bytes_per_second: bytes as f64 / elapsed,
                p50: percentile(&times, 0.5),
                p99: percentile(&times, 0.99),
                udp_drops,
                cpu_per_gb,
            });
        }
    }
    Ok(per_path)
}

/// The median of `values` (the mean of the middle two of an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|x, y| x.partial_cmp(y).expect("no NaN"));
    let middle = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0]), 3.0);
        assert_eq!(median(vec![0.9, 1.2, 0.8]), 0.9);
        assert_eq!(median(vec![1.0, 0.5, 2.0, 0.7]), 0.85);
    }
}
