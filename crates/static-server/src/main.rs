//! `cloudweb-static`: serves a directory of static files over HTTP/1.1 for
//! cloud-web static sites. It uses std alone so it links fully static and
//! runs as the only file of a `FROM scratch` image; the site itself is
//! mounted read-only at runtime. One thread per connection keeps it simple;
//! it is quiet by design (no per-request log), since the ingress in front
//! of it already records requests.

mod args;
mod content_type;
mod http;
mod resolve;
mod shutdown;

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;

use args::Command;
use resolve::Site;

fn main() -> ExitCode {
    let options = match args::parse(std::env::args_os().skip(1)) {
        Ok(Command::Serve(options)) => options,
        Ok(Command::Help) => {
            print!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("cloudweb-static: {error}\n\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    let site = match Site::new(&options.root, options.spa) {
        Ok(site) => Arc::new(site),
        Err(error) => {
            eprintln!("cloudweb-static: cannot serve --root {}: {error}", options.root.display());
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(options.listen) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("cloudweb-static: cannot listen on {}: {error}", options.listen);
            return ExitCode::FAILURE;
        }
    };
    shutdown::exit_on_termination_signals();
    eprintln!("cloudweb-static: serving {} on {}", site.root().display(), options.listen);
    serve(&listener, &site);
    ExitCode::FAILURE
}

/// Accepts connections forever, one thread each.
fn serve(listener: &TcpListener, site: &Arc<Site>) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let site = Arc::clone(site);
                // A failed spawn (thread limit reached) drops the connection,
                // which the client sees as a reset and may retry.
                let _ = std::thread::Builder::new().spawn(move || http::serve_connection(stream, &site));
            }
            // Accept errors (EMFILE, a connection aborted before accept) are
            // transient; report them, since they mean clients are refused.
            Err(error) => {
                eprintln!("cloudweb-static: accept failed: {error}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}
