//! Container usage for the usage sample: CPU (in cores), memory and limit,
//! restarts and start time of this node's app containers.

use bollard::query_parameters::{InspectContainerOptions, StatsOptionsBuilder};
use cloudweb_protocol::ContainerUsage;
use futures_util::StreamExt;

use super::{DockerRuntime, RuntimeError};

impl DockerRuntime {
    /// Usage of this node's running app containers (`cw-*`). Asks Docker
    /// nothing more when none runs.
    pub async fn container_usage(&self) -> Result<Vec<ContainerUsage>, RuntimeError> {
        let running: Vec<_> = self.own_containers(None).await?.into_iter().filter(|c| c.running && c.name.starts_with("cw-")).collect();
        if running.is_empty() {
            return Ok(Vec::new());
        }
        let docker = self.docker()?;
        let samples = running.iter().map(|container| {
            let docker = docker.clone();
            async move {
                // stream=false makes the daemon take two readings, so the
                // answer carries a CPU delta.
                let stats = docker
                    .stats(&container.id, Some(StatsOptionsBuilder::new().stream(false).build()))
                    .next()
                    .await
                    .and_then(Result::ok);
                let inspect = docker.inspect_container(&container.id, None::<InspectContainerOptions>).await.ok();
                let mut usage = ContainerUsage { container: container.name.clone(), ..Default::default() };
                if let Some(stats) = stats {
                    let cpu = stats.cpu_stats.as_ref();
                    let pre = stats.precpu_stats.as_ref();
                    let total = |s: Option<&bollard::models::ContainerCpuStats>| s.and_then(|s| s.cpu_usage.as_ref()).and_then(|u| u.total_usage);
                    let system = |s: Option<&bollard::models::ContainerCpuStats>| s.and_then(|s| s.system_cpu_usage);
                    if let (Some(t1), Some(t0), Some(s1), Some(s0), Some(cpus)) = (total(cpu), total(pre), system(cpu), system(pre), cpu.and_then(|c| c.online_cpus)) {
                        if s1 > s0 && t1 >= t0 {
                            usage.cpu_cores = Some((t1 - t0) as f64 / (s1 - s0) as f64 * f64::from(cpus));
                        }
                    }
                    if let Some(memory) = stats.memory_stats {
                        // Like `docker stats`: page cache that can be
                        // reclaimed does not count.
                        let cache = memory.stats.as_ref().and_then(|s| s.get("inactive_file").or_else(|| s.get("total_inactive_file")).copied()).unwrap_or(0);
                        usage.mem_bytes = memory.usage.map(|u| u.saturating_sub(cache));
                        usage.mem_limit = memory.limit;
                    }
                }
                if let Some(inspect) = inspect {
                    usage.restarts = inspect.restart_count.map(|r| r.max(0) as u32);
                    usage.started_at = inspect.state.and_then(|s| s.started_at).filter(|s| !s.starts_with("0001-"));
                }
                usage
            }
        });
        Ok(futures_util::future::join_all(samples).await)
    }

    /// Whether the engine is Docker Desktop, whose daemon runs in a VM that
    /// cannot reach the mesh.
    pub async fn is_docker_desktop(&self) -> Result<bool, RuntimeError> {
        let info = self.docker()?.info().await?;
        Ok(info.operating_system.as_deref().is_some_and(|os| os.contains("Docker Desktop")))
    }
}
