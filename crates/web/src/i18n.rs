//! The dashboard's words: one catalogue per language, keyed by a short
//! identifier. Every string a page shows comes from here (or from the
//! data it displays), so a translation is a change to one file.

use std::collections::HashMap;
use std::sync::OnceLock;

/// A language the dashboard speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    En,
    Es,
}

impl Lang {
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Es => "es",
        }
    }

    pub fn parse(code: &str) -> Option<Lang> {
        match code.trim().to_ascii_lowercase().as_str() {
            "en" => Some(Lang::En),
            "es" => Some(Lang::Es),
            _ => None,
        }
    }

    /// The best match for an `Accept-Language` header: the first listed
    /// language (by quality, then order) we speak; English otherwise.
    pub fn from_accept_language(header: &str) -> Lang {
        let mut choices: Vec<(f32, usize, Lang)> = header
            .split(',')
            .enumerate()
            .filter_map(|(order, part)| {
                let mut pieces = part.split(';');
                let tag = pieces.next()?.trim();
                let quality = pieces
                    .find_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.parse::<f32>().ok()))
                    .unwrap_or(1.0);
                let primary = tag.split('-').next()?;
                Lang::parse(primary).map(|lang| (quality, order, lang))
            })
            .filter(|(quality, _, _)| *quality > 0.0)
            .collect();
        choices.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)));
        choices.first().map(|c| c.2).unwrap_or(Lang::En)
    }

    /// The word for `key`. A key missing from the catalogue shows as
    /// itself (the catalogue test keeps that from shipping).
    pub fn t(self, key: &'static str) -> &'static str {
        static TABLES: OnceLock<[HashMap<&'static str, &'static str>; 2]> = OnceLock::new();
        let tables = TABLES.get_or_init(|| [EN.iter().copied().collect(), ES.iter().copied().collect()]);
        let table = match self {
            Lang::En => &tables[0],
            Lang::Es => &tables[1],
        };
        table.get(key).copied().unwrap_or(key)
    }
}

pub const EN: &[(&str, &str)] = &[
    ("product", "cloud-web"),
    ("nav.nodes", "Nodes"),
    ("nav.apps", "Apps"),
    ("nav.monitoring", "Monitoring"),
    ("nav.data", "Data"),
    ("services.title", "Databases"),
    ("services.help", "Managed PostgreSQL, Redis and MariaDB, reachable only inside the cluster. A linked app gets the connection URL at its next deploy; passwords are never shown. Their data lives on volumes:"),
    ("services.none", "No databases yet."),
    ("services.type", "Type"),
    ("services.state", "State"),
    ("services.address", "Address"),
    ("services.links", "Linked apps"),
    ("services.link", "Link app"),
    ("services.unlink", "Unlink"),
    ("services.create", "Create database"),
    ("services.version", "Version"),
    ("services.delete", "Delete database"),
    ("services.delete_data", "Delete its data too"),
    ("services.rotate", "Rotate password"),
    ("services.rotating", "Password rotation unfinished:"),
    ("services.upgrade", "Change version"),
    ("services.confirm_delete", "Delete this database? Its container stops; its data stays in its volume unless you tick the box."),
    ("nav.logout", "Log out"),
    ("nav.language", "Language"),
    ("nav.switch", "Switch"),
    ("nav.skip", "Skip to content"),
    ("nav.menu", "Language and account"),
    ("login.title", "Log in"),
    ("login.name", "User name"),
    ("login.password", "Password"),
    ("login.help", "The first user comes from {command}; more are added with {api}."),
    ("login.submit", "Log in"),
    ("login.invalid", "Wrong name or password."),
    ("login.too_many", "Too many login attempts; try again later"),
    ("csrf.invalid", "The form expired; reload the page and try again."),
    ("nodes.title", "Nodes"),
    ("nodes.empty", "No node has joined yet. Generate a join token and run its command on the machine you want to add."),
    ("nodes.name", "Name"),
    ("nodes.address", "Cluster address"),
    ("nodes.mesh_off", "mesh off"),
    ("nodes.mesh_off_help", "This node runs without the WireGuard mesh, so it has no cluster address."),
    ("nodes.state", "State"),
    ("nodes.cpu", "CPU"),
    ("nodes.memory", "Memory"),
    ("nodes.disk", "Disk"),
    ("nodes.instances", "Instances"),
    ("nodes.health", "Health"),
    ("nodes.version", "Agent version"),
    ("nodes.heartbeat", "Last heartbeat"),
    ("nodes.actions", "Actions"),
    ("nodes.join_token", "Generate join token"),
    ("nodes.join_command", "Run this command on the new machine:"),
    ("nodes.join_expires", "The token works once and expires at"),
    ("nodes.drain", "Drain"),
    ("nodes.reactivate", "Reactivate"),
    ("nodes.remove", "Remove"),
    ("nodes.force", "Force: the node is unreachable"),
    ("nodes.force_warning", "Its instances become failed and are started elsewhere where there is room."),
    ("nodes.confirm_drain", "Drain this node? No new instances are placed on it and its instances move to other nodes; each old one stops once its replacement runs."),
    ("nodes.confirm_reactivate", "Reactivate this node? It takes new instances again."),
    ("nodes.confirm_remove", "Remove this node from the cluster? Its agent stops and the node must join again to come back."),
    ("nodes.waiting", "Could not be moved (no room):"),
    ("nodes.never", "never"),
    ("nodes.ago", "{age} ago"),
    ("nodes.ingress", "ingress"),
    ("nodes.cores", "cores"),
    ("state.ready", "ready"),
    ("state.draining", "draining"),
    ("state.unreachable", "unreachable"),
    ("health.healthy", "healthy"),
    ("health.degraded", "degraded"),
    ("health.unknown", "unknown"),
    ("health.mesh", "mesh"),
    ("apps.title", "Apps"),
    ("apps.empty", "No app yet. Create one from a git repository below."),
    ("apps.name", "Name"),
    ("apps.status", "Status"),
    ("apps.url", "URL"),
    ("apps.repo", "Git URL"),
    ("apps.branch", "Branch"),
    ("apps.port", "Port the app listens on"),
    ("apps.create", "Create app"),
    ("apps.gitlab_project", "GitLab project"),
    ("apps.gitlab_use_url", "None: use the git URL below"),
    ("apps.gitlab_help", "Pick one of your GitLab projects (it gets a push webhook and is cloned as you), or leave it and give a git URL."),
    ("apps.gitlab_none", "Your GitLab identity reaches no project; give a git URL."),
    ("apps.gitlab_failed", "Your GitLab projects could not be listed; the git URL still works"),
    ("apps.branch_default", "the project's default branch"),
    ("apps.strategy", "Build"),
    ("apps.strategy.auto", "Detect (Dockerfile, else static site)"),
    ("apps.strategy.dockerfile", "Dockerfile"),
    ("apps.strategy.static", "Static site"),
    ("apps.strategy.buildpacks", "Buildpacks"),
    ("apps.install_cmd", "Install command (static)"),
    ("apps.build_cmd", "Build command (static)"),
    ("apps.output_dir", "Output directory (static)"),
    ("apps.spa", "Single-page app: serve index.html for unknown paths (static)"),
    ("apps.spa.auto", "detect"),
    ("apps.instances", "Instances"),
    ("apps.cpu", "CPU cores per instance"),
    ("apps.memory", "Memory per instance (MiB)"),
    ("apps.health_path", "Health check path"),
    ("apps.settings", "Settings"),
    ("apps.edit_settings", "Change settings"),
    ("apps.edit_settings_help", "The next deployment uses them; running instances keep theirs until then. Empty CPU, memory and build fields mean the defaults."),
    ("apps.health_timeout", "Health check timeout (seconds)"),
    ("apps.build_timeout", "Build time limit (seconds)"),
    ("apps.domains", "Domains"),
    ("apps.domains_help", "Custom domains, one per line. The default address always works."),
    ("apps.certificates", "Certificates"),
    ("apps.cert_host", "Host"),
    ("apps.cert_state", "Certificate"),
    ("apps.cert_not_after", "Valid until"),
    ("apps.cert_issuer", "Issuer"),
    ("apps.cert_orders", "ACME orders"),
    ("apps.cert_error", "Last error"),
    ("cert.internal", "internal name (no public certificate)"),
    ("cert.issuing", "issuing"),
    ("cert.valid", "valid"),
    ("cert.renewing", "renewing"),
    ("cert.failed", "failed"),
    ("apps.save", "Save"),
    ("apps.env", "Environment variables"),
    ("apps.env_help", "Values are write-only: they are stored sealed and never shown again."),
    ("apps.env_name", "Name"),
    ("apps.env_value", "Value"),
    ("apps.env_set", "Set"),
    ("apps.env_unset", "Unset"),
    ("apps.env_none", "No variables."),
    ("apps.deploy", "Deploy"),
    ("apps.redeploy", "Redeploy"),
    ("apps.commit", "Commit (optional)"),
    ("apps.delete", "Delete app"),
    ("apps.confirm_delete", "Delete this app? Its instances stop, its addresses stop answering, and its deployments are forgotten."),
    ("apps.deployments", "Deployments"),
    ("apps.no_deployments", "Not deployed yet."),
    ("apps.none", "none"),
    ("apps.resources", "Resources"),
    ("apps.unlimited", "not limited"),
    ("apps.runtime_logs", "Runtime logs"),
    ("apps.runtime_logs_empty", "The app has printed nothing yet."),
    ("apps.runtime_logs_help", "The newest lines the app's containers printed (stdout and stderr); new lines appear as they come."),
    ("deploy.title", "Deployment"),
    ("deploy.state", "State"),
    ("deploy.created", "Started"),
    ("deploy.updated", "Last change"),
    ("deploy.commit", "Commit"),
    ("deploy.image", "Image"),
    ("deploy.nodes", "Nodes"),
    ("deploy.kind", "Kind"),
    ("deploy.error", "Error"),
    ("deploy.timeline", "Timeline"),
    ("deploy.logs", "Build log"),
    ("deploy.logs_empty", "No log lines yet."),
    ("deploy.rollback", "Roll back to this"),
    ("deploy.cancel", "Cancel"),
    ("deploy.live", "live"),
    ("deploy.view", "View"),
    ("dstate.queued", "queued"),
    ("dstate.building", "building"),
    ("dstate.deploying", "deploying"),
    ("dstate.running", "running"),
    ("dstate.failed", "failed"),
    ("dstate.superseded", "superseded"),
    ("mon.title", "Monitoring"),
    ("mon.range", "Range"),
    ("mon.cpu", "CPU (%)"),
    ("mon.memory", "Memory"),
    ("mon.disk", "Disk"),
    ("mon.app_cpu", "CPU (cores)"),
    ("mon.restarts", "Container restarts"),
    ("mon.requests", "Requests by status class"),
    ("mon.latency", "Mean latency (ms)"),
    ("mon.slow", "Slow requests"),
    ("mon.no_data", "no data"),
    ("mon.since", "since {time}"),
    ("mon.gap_note", "Shaded gaps mean no sample was stored for that time. Point at a chart to read its values."),
    ("mon.nodes", "Nodes"),
    ("mon.apps", "Apps"),
    ("mon.cluster", "cluster"),
    ("mon.cluster_usage", "Cluster usage"),
    ("mon.cluster_note", "CPU is the mean over the nodes that reported; memory and disk are summed. Each node's and app's own charts are on its page."),
    ("mon.cpu_mean", "Mean CPU (%)"),
    ("mon.attention", "Nodes needing attention"),
    ("mon.attention_none", "Every node is ready and healthy, under 90 % CPU, memory and disk."),
    ("mon.attention_all", "All {count} on the Nodes page"),
    ("mon.top_node_cpu", "Busiest nodes by CPU"),
    ("mon.top_node_memory", "Busiest nodes by memory"),
    ("mon.top_app_cpu", "Apps by CPU (last 2 min)"),
    ("mon.top_app_memory", "Apps by memory (last 2 min)"),
    ("mon.top_hosts", "Busiest hosts"),
    ("mon.host", "Host"),
    ("mon.requests_5xx", "Requests / 5xx"),
    ("nodes.attention", "Needs attention"),
    ("node.back", "All nodes"),
    ("node.joined", "Joined"),
    ("node.features", "Features"),
    ("node.certificate", "Certificate (SHA-256)"),
    ("apps.charts", "Usage and traffic"),
    ("volumes.title", "Volumes"),
    ("volumes.help", "Files under a volume's path outlive deploys. An app with volumes runs on the node that holds them; a change applies at the next deploy."),
    ("volumes.page_help", "Every volume in the cluster. A detached volume keeps its data until you delete it here."),
    ("volumes.none", "No volumes."),
    ("volumes.name", "Name"),
    ("volumes.path", "Path"),
    ("volumes.node", "Node"),
    ("volumes.size", "Size"),
    ("volumes.app", "App"),
    ("volumes.attach", "Add volume"),
    ("volumes.detach", "Detach"),
    ("volumes.detached", "detached"),
    ("volumes.no_node_yet", "at the next deploy"),
    ("volumes.delete", "Delete volume"),
    ("volumes.move", "Move to"),
    ("volumes.last_move", "Last move"),
    ("volumes.confirm_delete", "Delete this volume and all its data on its node? This cannot be undone."),
    ("volumes.on_delete", "This app has volumes:"),
    ("volumes.keep", "Keep them, detached, with their data"),
    ("volumes.delete_too", "Delete them and their data too"),
    ("list.search", "Search"),
    ("list.show", "Show"),
    ("list.all", "all"),
    ("list.apply", "Apply"),
    ("list.none", "Nothing matches."),
    ("list.showing", "{from}–{to} of {total}"),
    ("list.pages", "Pages"),
    ("list.previous", "Previous"),
    ("list.next", "Next"),
    ("list.page", "page {page} of {pages}"),
    ("common.confirm", "Confirm"),
    ("common.cancel", "Cancel"),
    ("common.back", "Back"),
    ("common.error", "Error"),
    ("common.done", "Done."),
    ("common.yes", "yes"),
    ("common.no", "no"),
    ("common.copy", "Copy"),
    ("common.not_found", "Not found."),
];

pub const ES: &[(&str, &str)] = &[
    ("product", "cloud-web"),
    ("nav.nodes", "Nodos"),
    ("nav.apps", "Apps"),
    ("nav.monitoring", "Monitorización"),
    ("nav.data", "Datos"),
    ("services.title", "Bases de datos"),
    ("services.help", "PostgreSQL, Redis y MariaDB gestionados, accesibles solo dentro del clúster. Una app vinculada recibe la URL de conexión en su próximo despliegue; las contraseñas nunca se muestran. Sus datos viven en volúmenes:"),
    ("services.none", "Aún no hay bases de datos."),
    ("services.type", "Tipo"),
    ("services.state", "Estado"),
    ("services.address", "Dirección"),
    ("services.links", "Apps vinculadas"),
    ("services.link", "Vincular app"),
    ("services.unlink", "Desvincular"),
    ("services.create", "Crear base de datos"),
    ("services.version", "Versión"),
    ("services.delete", "Borrar base de datos"),
    ("services.delete_data", "Borrar también sus datos"),
    ("services.rotate", "Rotar contraseña"),
    ("services.rotating", "Rotación de contraseña sin terminar:"),
    ("services.upgrade", "Cambiar versión"),
    ("services.confirm_delete", "¿Borrar esta base de datos? Su contenedor se detiene; sus datos quedan en su volumen salvo que marques la casilla."),
    ("nav.logout", "Cerrar sesión"),
    ("nav.language", "Idioma"),
    ("nav.switch", "Cambiar"),
    ("nav.skip", "Saltar al contenido"),
    ("nav.menu", "Idioma y cuenta"),
    ("login.title", "Iniciar sesión"),
    ("login.name", "Usuario"),
    ("login.password", "Contraseña"),
    ("login.help", "El primer usuario se crea con {command}; los demás, con {api}."),
    ("login.submit", "Entrar"),
    ("login.invalid", "Usuario o contraseña incorrectos."),
    ("login.too_many", "Demasiados intentos de inicio de sesión; vuelve a intentarlo más tarde"),
    ("csrf.invalid", "El formulario caducó; recarga la página e inténtalo de nuevo."),
    ("nodes.title", "Nodos"),
    ("nodes.empty", "Aún no se ha unido ningún nodo. Genera un token de unión y ejecuta su comando en la máquina que quieras añadir."),
    ("nodes.name", "Nombre"),
    ("nodes.address", "Dirección de clúster"),
    ("nodes.mesh_off", "malla desactivada"),
    ("nodes.mesh_off_help", "Este nodo funciona sin la malla WireGuard, así que no tiene dirección de clúster."),
    ("nodes.state", "Estado"),
    ("nodes.cpu", "CPU"),
    ("nodes.memory", "Memoria"),
    ("nodes.disk", "Disco"),
    ("nodes.instances", "Instancias"),
    ("nodes.health", "Salud"),
    ("nodes.version", "Versión del agente"),
    ("nodes.heartbeat", "Último latido"),
    ("nodes.actions", "Acciones"),
    ("nodes.join_token", "Generar token de unión"),
    ("nodes.join_command", "Ejecuta este comando en la máquina nueva:"),
    ("nodes.join_expires", "El token sirve una vez y caduca el"),
    ("nodes.drain", "Drenar"),
    ("nodes.reactivate", "Reactivar"),
    ("nodes.remove", "Quitar"),
    ("nodes.force", "Forzar: el nodo no responde"),
    ("nodes.force_warning", "Sus instancias pasan a fallidas y se arrancan en otros nodos donde haya sitio."),
    ("nodes.confirm_drain", "¿Drenar este nodo? No recibe instancias nuevas y las suyas se mueven a otros nodos; cada una se detiene cuando su sustituta funciona."),
    ("nodes.confirm_reactivate", "¿Reactivar este nodo? Vuelve a recibir instancias nuevas."),
    ("nodes.confirm_remove", "¿Quitar este nodo del clúster? Su agente se detiene y el nodo tendrá que unirse de nuevo para volver."),
    ("nodes.waiting", "No se pudieron mover (no hay sitio):"),
    ("nodes.never", "nunca"),
    ("nodes.ago", "hace {age}"),
    ("nodes.ingress", "entrada"),
    ("nodes.cores", "núcleos"),
    ("state.ready", "listo"),
    ("state.draining", "drenando"),
    ("state.unreachable", "inalcanzable"),
    ("health.healthy", "sana"),
    ("health.degraded", "degradada"),
    ("health.unknown", "desconocida"),
    ("health.mesh", "malla"),
    ("apps.title", "Apps"),
    ("apps.empty", "Aún no hay apps. Crea una desde un repositorio git más abajo."),
    ("apps.name", "Nombre"),
    ("apps.status", "Estado"),
    ("apps.url", "URL"),
    ("apps.repo", "URL de git"),
    ("apps.branch", "Rama"),
    ("apps.port", "Puerto en el que escucha la app"),
    ("apps.create", "Crear app"),
    ("apps.gitlab_project", "Proyecto de GitLab"),
    ("apps.gitlab_use_url", "Ninguno: usar la URL de git de abajo"),
    ("apps.gitlab_help", "Elige uno de tus proyectos de GitLab (recibe un webhook de push y se clona en tu nombre), o déjalo y da una URL de git."),
    ("apps.gitlab_none", "Tu identidad de GitLab no alcanza ningún proyecto; da una URL de git."),
    ("apps.gitlab_failed", "No se pudieron listar tus proyectos de GitLab; la URL de git sigue funcionando"),
    ("apps.branch_default", "la rama por defecto del proyecto"),
    ("apps.strategy", "Construcción"),
    ("apps.strategy.auto", "Detectar (Dockerfile, si no sitio estático)"),
    ("apps.strategy.dockerfile", "Dockerfile"),
    ("apps.strategy.static", "Sitio estático"),
    ("apps.strategy.buildpacks", "Buildpacks"),
    ("apps.install_cmd", "Comando de instalación (estático)"),
    ("apps.build_cmd", "Comando de construcción (estático)"),
    ("apps.output_dir", "Directorio de salida (estático)"),
    ("apps.spa", "App de una página: servir index.html en rutas desconocidas (estático)"),
    ("apps.spa.auto", "detectar"),
    ("apps.instances", "Instancias"),
    ("apps.cpu", "Núcleos de CPU por instancia"),
    ("apps.memory", "Memoria por instancia (MiB)"),
    ("apps.health_path", "Ruta de comprobación de salud"),
    ("apps.settings", "Configuración"),
    ("apps.edit_settings", "Cambiar la configuración"),
    ("apps.edit_settings_help", "El próximo despliegue la usa; las instancias en marcha conservan la suya hasta entonces. CPU, memoria y compilación vacías significan los valores por defecto."),
    ("apps.health_timeout", "Tiempo de espera de la comprobación de salud (segundos)"),
    ("apps.build_timeout", "Tiempo máximo de compilación (segundos)"),
    ("apps.domains", "Dominios"),
    ("apps.domains_help", "Dominios propios, uno por línea. La dirección por defecto siempre funciona."),
    ("apps.certificates", "Certificados"),
    ("apps.cert_host", "Nombre"),
    ("apps.cert_state", "Certificado"),
    ("apps.cert_not_after", "Válido hasta"),
    ("apps.cert_issuer", "Emisor"),
    ("apps.cert_orders", "Pedidos ACME"),
    ("apps.cert_error", "Último error"),
    ("cert.internal", "nombre interno (sin certificado público)"),
    ("cert.issuing", "emitiendo"),
    ("cert.valid", "válido"),
    ("cert.renewing", "renovando"),
    ("cert.failed", "falló"),
    ("apps.save", "Guardar"),
    ("apps.env", "Variables de entorno"),
    ("apps.env_help", "Los valores son de solo escritura: se guardan sellados y no se vuelven a mostrar."),
    ("apps.env_name", "Nombre"),
    ("apps.env_value", "Valor"),
    ("apps.env_set", "Definir"),
    ("apps.env_unset", "Quitar"),
    ("apps.env_none", "Sin variables."),
    ("apps.deploy", "Desplegar"),
    ("apps.redeploy", "Volver a desplegar"),
    ("apps.commit", "Commit (opcional)"),
    ("apps.delete", "Borrar app"),
    ("apps.confirm_delete", "¿Borrar esta app? Sus instancias se detienen, sus direcciones dejan de responder y se olvidan sus despliegues."),
    ("apps.deployments", "Despliegues"),
    ("apps.no_deployments", "Aún sin desplegar."),
    ("apps.none", "ninguno"),
    ("apps.resources", "Recursos"),
    ("apps.unlimited", "sin límite"),
    ("apps.runtime_logs", "Logs de ejecución"),
    ("apps.runtime_logs_empty", "La app aún no ha escrito nada."),
    ("apps.runtime_logs_help", "Las últimas líneas que escribieron los contenedores de la app (stdout y stderr); las nuevas aparecen al llegar."),
    ("deploy.title", "Despliegue"),
    ("deploy.state", "Estado"),
    ("deploy.created", "Inicio"),
    ("deploy.updated", "Último cambio"),
    ("deploy.commit", "Commit"),
    ("deploy.image", "Imagen"),
    ("deploy.nodes", "Nodos"),
    ("deploy.kind", "Tipo"),
    ("deploy.error", "Error"),
    ("deploy.timeline", "Cronología"),
    ("deploy.logs", "Log de construcción"),
    ("deploy.logs_empty", "Aún no hay líneas de log."),
    ("deploy.rollback", "Volver a este"),
    ("deploy.cancel", "Cancelar"),
    ("deploy.live", "en vivo"),
    ("deploy.view", "Ver"),
    ("dstate.queued", "en cola"),
    ("dstate.building", "construyendo"),
    ("dstate.deploying", "desplegando"),
    ("dstate.running", "en marcha"),
    ("dstate.failed", "fallido"),
    ("dstate.superseded", "reemplazado"),
    ("mon.title", "Monitorización"),
    ("mon.range", "Periodo"),
    ("mon.cpu", "CPU (%)"),
    ("mon.memory", "Memoria"),
    ("mon.disk", "Disco"),
    ("mon.app_cpu", "CPU (núcleos)"),
    ("mon.restarts", "Reinicios de contenedores"),
    ("mon.requests", "Peticiones por clase de estado"),
    ("mon.latency", "Latencia media (ms)"),
    ("mon.slow", "Peticiones lentas"),
    ("mon.no_data", "sin datos"),
    ("mon.since", "desde {time}"),
    ("mon.gap_note", "Los huecos sombreados indican que no se guardó ninguna muestra en ese momento. Señale un gráfico para leer sus valores."),
    ("mon.nodes", "Nodos"),
    ("mon.apps", "Apps"),
    ("mon.cluster", "clúster"),
    ("mon.cluster_usage", "Uso del clúster"),
    ("mon.cluster_note", "La CPU es la media de los nodos que informaron; la memoria y el disco se suman. Los gráficos de cada nodo y de cada app están en su página."),
    ("mon.cpu_mean", "CPU media (%)"),
    ("mon.attention", "Nodos que requieren atención"),
    ("mon.attention_none", "Todos los nodos están listos y sanos, por debajo del 90 % de CPU, memoria y disco."),
    ("mon.attention_all", "Los {count} en la página de nodos"),
    ("mon.top_node_cpu", "Nodos más ocupados por CPU"),
    ("mon.top_node_memory", "Nodos más ocupados por memoria"),
    ("mon.top_app_cpu", "Apps por CPU (últimos 2 min)"),
    ("mon.top_app_memory", "Apps por memoria (últimos 2 min)"),
    ("mon.top_hosts", "Hosts con más tráfico"),
    ("mon.host", "Nombre de host"),
    ("mon.requests_5xx", "Peticiones / 5xx"),
    ("nodes.attention", "Requiere atención"),
    ("node.back", "Todos los nodos"),
    ("node.joined", "Unido"),
    ("node.features", "Funciones"),
    ("node.certificate", "Certificado (SHA-256)"),
    ("apps.charts", "Uso y tráfico"),
    ("volumes.title", "Volúmenes"),
    ("volumes.help", "Los archivos bajo la ruta de un volumen sobreviven a los despliegues. Una app con volúmenes corre en el nodo que los guarda; un cambio se aplica en el próximo despliegue."),
    ("volumes.page_help", "Todos los volúmenes del clúster. Un volumen desvinculado conserva sus datos hasta que lo borres aquí."),
    ("volumes.none", "Sin volúmenes."),
    ("volumes.name", "Nombre"),
    ("volumes.path", "Ruta"),
    ("volumes.node", "Nodo"),
    ("volumes.size", "Tamaño"),
    ("volumes.app", "App"),
    ("volumes.attach", "Añadir volumen"),
    ("volumes.detach", "Desvincular"),
    ("volumes.detached", "desvinculado"),
    ("volumes.no_node_yet", "en el próximo despliegue"),
    ("volumes.delete", "Borrar volumen"),
    ("volumes.move", "Mover a"),
    ("volumes.last_move", "Último traslado"),
    ("volumes.confirm_delete", "¿Borrar este volumen y todos sus datos en su nodo? No se puede deshacer."),
    ("volumes.on_delete", "Esta app tiene volúmenes:"),
    ("volumes.keep", "Conservarlos, desvinculados, con sus datos"),
    ("volumes.delete_too", "Borrarlos también, con sus datos"),
    ("list.search", "Buscar"),
    ("list.show", "Mostrar"),
    ("list.all", "todos"),
    ("list.apply", "Aplicar"),
    ("list.none", "Nada coincide."),
    ("list.showing", "{from}–{to} de {total}"),
    ("list.pages", "Páginas"),
    ("list.previous", "Anterior"),
    ("list.next", "Siguiente"),
    ("list.page", "página {page} de {pages}"),
    ("common.confirm", "Confirmar"),
    ("common.cancel", "Cancelar"),
    ("common.back", "Volver"),
    ("common.error", "Error"),
    ("common.done", "Hecho."),
    ("common.yes", "sí"),
    ("common.no", "no"),
    ("common.copy", "Copiar"),
    ("common.not_found", "No encontrado."),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn both_catalogues_have_the_same_keys_and_no_duplicates() {
        let en: BTreeSet<&str> = EN.iter().map(|(k, _)| *k).collect();
        let es: BTreeSet<&str> = ES.iter().map(|(k, _)| *k).collect();
        assert_eq!(en.len(), EN.len(), "a key appears twice in the English catalogue");
        assert_eq!(es.len(), ES.len(), "a key appears twice in the Spanish catalogue");
        let only_en: Vec<_> = en.difference(&es).collect();
        let only_es: Vec<_> = es.difference(&en).collect();
        assert!(only_en.is_empty() && only_es.is_empty(), "only in English: {only_en:?}; only in Spanish: {only_es:?}");
        assert!(EN.iter().chain(ES).all(|(_, v)| !v.trim().is_empty()), "an empty translation");
    }

    #[test]
    fn every_key_the_pages_use_is_in_the_catalogue() {
        // The pages name keys as string literals `t("…")`; scan the sources
        // so a typo cannot render as a raw key.
        let keys: BTreeSet<&str> = EN.iter().map(|(k, _)| *k).collect();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("i18n.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for piece in text.split(".t(\"").skip(1) {
                let key = &piece[..piece.find('"').unwrap()];
                assert!(keys.contains(key), "{} uses unknown key {key:?}", path.display());
            }
        }
    }

    /// Markup in a catalogue would show as typed (pages escape every word),
    /// and a Spanish word left in English is a missed translation: only
    /// these are the same in both languages.
    #[test]
    fn catalogues_hold_plain_words_and_spanish_translates_them() {
        const SAME_IN_BOTH: &[&str] = &[
            "product", "nav.apps", "apps.title", "mon.apps", "nodes.cpu", "mon.cpu", "apps.url", "apps.strategy.dockerfile",
            "apps.strategy.buildpacks", "deploy.commit", "deploy.error", "common.error", "common.no", "volumes.app",
        ];
        for (key, value) in EN.iter().chain(ES) {
            assert!(!value.contains('`') && !value.contains('<'), "{key}: markup in {value:?}");
        }
        let english: HashMap<&str, &str> = EN.iter().copied().collect();
        for (key, value) in ES {
            if english.get(key) == Some(value) {
                assert!(SAME_IN_BOTH.contains(key), "{key} is not translated: {value:?}");
            }
        }
        assert_eq!(Lang::Es.t("nodes.ingress"), "entrada");
    }

    #[test]
    fn accept_language_picks_the_best_language_we_speak() {
        let check = |header: &str, want: Lang| assert_eq!(Lang::from_accept_language(header), want, "{header}");
        check("es-ES,es;q=0.9,en;q=0.8", Lang::Es);
        check("en-US,en;q=0.9,es;q=0.8", Lang::En);
        check("fr-FR,fr;q=0.9,es;q=0.5", Lang::Es);
        check("de, en;q=0.1, es;q=0.4", Lang::Es);
        check("es;q=0", Lang::En);
        check("", Lang::En);
        check("*", Lang::En);
        assert_eq!(Lang::Es.t("health.healthy"), "sana");
        assert_eq!(Lang::Es.t("health.mesh"), "malla");
        assert_eq!(Lang::Es.t("nodes.join_token"), "Generar token de unión");
    }
}
