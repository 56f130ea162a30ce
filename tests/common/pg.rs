//! PostgreSQL for the store's tests: a database of the test's own on the machine's server
//! (created with a unique name, dropped after, also when the test panics), and, for the fault
//! tests, a server of the test's own on another port that the test stops and starts.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use hookrelay::store::PgStore;
use hookrelay_tools::kit::{ScratchDb, pg_server_url};

/// A database of the test's own (see [`ScratchDb`]), dropped with this value.
pub struct TestDb {
    pub url: String,
    _db: ScratchDb,
}

impl TestDb {
    pub async fn create() -> Self {
        Self::create_on(&pg_server_url()).await
    }

    pub async fn create_on(admin: &str) -> Self {
        let db = ScratchDb::create_on(admin, "hookrelay_t").await.unwrap();
        Self {
            url: db.url.clone(),
            _db: db,
        }
    }

    /// A migrated store on this database.
    pub async fn store(&self) -> PgStore {
        let store = PgStore::connect(&self.url, Duration::from_secs(5))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        store
    }
}

/// A PostgreSQL server of the test's own on `port`, in a temporary directory: stopped and
/// started by the test, removed with this value. Never the machine's server.
pub struct PgNode {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
}

fn pg_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .expect("PostgreSQL's binaries under /usr/lib/postgresql (postgres/up installs them)")
}

fn as_postgres(program: &PathBuf) -> Command {
    // The server refuses to run as root.
    if nix_is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl PgNode {
    /// A node of the test's own on a free port, started off the runtime's threads (`initdb`
    /// and the server's start take a while); shared, as tests stop and start it from tasks.
    pub async fn started() -> std::sync::Arc<Self> {
        let port = super::node::free_port();
        std::sync::Arc::new(
            tokio::task::spawn_blocking(move || Self::start(port))
                .await
                .unwrap(),
        )
    }

    pub fn start(port: u16) -> Self {
        let bin = pg_bin();
        let dir =
            std::env::temp_dir().join(format!("hookrelay-pgnode-{port}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if nix_is_root() {
            assert!(
                Command::new("chown")
                    .arg("postgres:")
                    .arg(&dir)
                    .status()
                    .unwrap()
                    .success()
            );
        }
        let out = as_postgres(&bin.join("initdb"))
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let node = Self { port, dir, bin };
        node.resume();
        node
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl -D <its data directory>`.
    fn pg_ctl(&self) -> Command {
        let mut c = as_postgres(&self.bin.join("pg_ctl"));
        c.arg("-D").arg(self.dir.join("data"));
        c
    }

    /// Stops the server at once (connections are cut).
    pub fn stop(&self) {
        let _ = self
            .pg_ctl()
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }

    /// Starts it again and waits until it answers.
    pub fn resume(&self) {
        let out = self
            .pg_ctl()
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .arg("-o")
            .arg(format!(
                "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
                self.port,
                self.dir.display()
            ))
            .args(["-w", "start"])
            .output()
            .unwrap();
        // The server's own log says why (a port taken, shared memory, ...); it goes with the
        // directory when the node drops.
        assert!(
            out.status.success(),
            "pg_ctl start on port {}: {}\nserver log:\n{}",
            self.port,
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
        );
    }
}

impl Drop for PgNode {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
