//! An S3-compatible server for the backup tests: moto's standalone server
//! (`pip install 'moto[server]'`, which `scripts/deps.sh` does), on a free
//! loopback port, killed with the test. Its objects live in its memory, so
//! a test damages one through the S3 API (read, flip bytes, write back).

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

pub struct S3Server {
    pub port: u16,
    child: Child,
    http: reqwest::Client,
}

/// Credentials moto accepts (it checks none).
pub const ACCESS_KEY_ID: &str = "cloudweb-test-key";
pub const SECRET_ACCESS_KEY: &str = "cloudweb-test-secret-key-1234";

fn moto_binary() -> std::path::PathBuf {
    let out = std::process::Command::new("python3").args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]).output().expect("python3 runs");
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("moto_server")
}

impl S3Server {
    pub async fn start() -> S3Server {
        let port = crate::free_port();
        let mut command = Command::new(moto_binary());
        command.args(["-H", "127.0.0.1", "-p", &port.to_string()]).stdout(Stdio::null()).stderr(Stdio::null()).kill_on_drop(true);
        let child = command.spawn().expect("moto_server starts (scripts/deps.sh installs it)");
        let server = S3Server { port, child, http: reqwest::Client::new() };
        crate::wait_for(Duration::from_secs(30), "moto_server to answer", || async {
            server.http.get(server.url("/")).send().await.ok().map(|_| ())
        })
        .await
        .expect("moto_server answers");
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint())
    }

    pub async fn create_bucket(&self, bucket: &str) {
        let response = self.http.put(self.url(&format!("/{bucket}"))).send().await.unwrap();
        assert!(response.status().is_success(), "create bucket: {}", response.status());
    }

    /// The keys under `prefix`.
    pub async fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let text = self.http.get(self.url(&format!("/{bucket}?list-type=2&prefix={prefix}"))).send().await.unwrap().text().await.unwrap();
        text.split("<Key>").skip(1).filter_map(|part| part.split("</Key>").next()).map(str::to_string).collect()
    }

    pub async fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        self.http.get(self.url(&format!("/{bucket}/{key}"))).send().await.unwrap().bytes().await.unwrap().to_vec()
    }

    /// Writes an object with a signed request (boto3, which moto's package
    /// brings): moto refuses an unsigned write.
    pub async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &body).unwrap();
        let script = "import sys, boto3\n\
s3 = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2], aws_secret_access_key=sys.argv[3], region_name='us-east-1')\n\
s3.put_object(Bucket=sys.argv[4], Key=sys.argv[5], Body=open(sys.argv[6], 'rb').read())\n";
        let out = Command::new("python3")
            .args(["-c", script, &self.endpoint(), ACCESS_KEY_ID, SECRET_ACCESS_KEY, bucket, key, &file.path().to_string_lossy()])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "put {key}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Stops the server (a destination that went away).
    pub async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }
}
