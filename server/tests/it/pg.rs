//! A throwaway PostgreSQL cluster for the tests: `initdb` in a temporary folder, `postgres` on
//! a free loopback port, a user with a password (so tests can check that it never shows), and
//! `pg_ctl stop` at the end.
//!
//! The binaries are Debian's (`/usr/lib/postgresql/<version>/bin`, the newest), or those in
//! `REMAT_PG_BIN`; `.ci/setup` installs the `postgresql` package when they are missing. As root
//! the cluster runs as the `postgres` user (PostgreSQL refuses root). A test that needs the
//! cluster and cannot start it fails with the reason: it never passes without it.
//!
//! Each cluster has a watchdog (`setsid sh`) that stops it when the test process is gone, even
//! when it was killed: the shared cluster is never dropped.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The user and password of every test cluster.
pub const USER: &str = "remat";
pub const PASSWORD: &str = "pg-test-s3cret";

pub struct Cluster {
    /// The temporary folder (data in `data/`, the log in `log`); removed on drop.
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    as_postgres: bool,
    /// Whether it serves TLS (and only TLS over TCP): [`Cluster::start_tls`].
    tls: bool,
}

/// The certificate authorities of a TLS cluster, as PEM files.
pub struct Tls {
    /// What signed the server's certificate (issued for `localhost` only, not `127.0.0.1`).
    pub ca: PathBuf,
    /// An authority that signed nothing of the cluster's.
    pub other_ca: PathBuf,
    /// A client certificate for [`USER`] signed by `ca`, and its key: database `certdb` takes
    /// only that (`cert` authentication), the others a password.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

fn bin_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("REMAT_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| {
            format!(
                "PostgreSQL is not installed (/usr/lib/postgresql: {e}); `.ci/setup` installs \
                 Debian's `postgresql` package, or set REMAT_PG_BIN to a folder with initdb and pg_ctl"
            )
        })?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no /usr/lib/postgresql/<version>/bin/pg_ctl".to_string())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(54329)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Cluster {
    /// A new cluster, started.
    pub fn start() -> Result<Cluster, String> {
        let bin = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("remat-pg-")
            .tempdir()
            .map_err(|e| format!("a temporary folder for PostgreSQL: {e}"))?;
        let as_postgres = is_root();
        std::fs::write(dir.path().join("pwfile"), PASSWORD).map_err(|e| e.to_string())?;
        if as_postgres {
            let out = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .output()
                .map_err(|e| format!("chown: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "chown of {} to postgres: {}",
                    dir.path().display(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let cluster = Cluster {
            dir,
            bin,
            port: free_port(),
            as_postgres,
            tls: false,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D",
                path_str(&data)?,
                "-U",
                USER,
                "--pwfile",
                path_str(&cluster.dir.path().join("pwfile"))?,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        cluster.watchdog()?;
        cluster.resume()?;
        Ok(cluster)
    }

    /// A new cluster that takes TCP connections over TLS only (`hostssl` in `pg_hba.conf`),
    /// with a certificate for `localhost` signed by a certificate authority of the test's.
    pub fn start_tls() -> Result<(Cluster, Tls), String> {
        let mut cluster = Cluster::start()?;
        cluster.pause()?;
        let data = cluster.data();
        let ca = |name: &str| -> Result<(rcgen::CertificateParams, rcgen::KeyPair), String> {
            let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
            let mut params =
                rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            Ok((params, key))
        };
        let (ca_params, ca_key) = ca("remat test CA")?;
        let ca_cert = ca_params.self_signed(&ca_key).map_err(|e| e.to_string())?;
        let (other_params, other_key) = ca("another CA")?;
        let other_cert = other_params
            .self_signed(&other_key)
            .map_err(|e| e.to_string())?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let server_cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .and_then(|p| p.signed_by(&server_key, &issuer))
            .map_err(|e| e.to_string())?;
        let write = |path: &Path, text: &str| {
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
        };
        let client_key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let mut client_params =
            rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
        client_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, USER);
        let client_cert = client_params
            .signed_by(&client_key, &issuer)
            .map_err(|e| e.to_string())?;
        write(&data.join("server.crt"), &server_cert.pem())?;
        write(&data.join("root.crt"), &ca_cert.pem())?;
        let key_path = data.join("server.key");
        write(&key_path, &server_key.serialize_pem())?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| e.to_string())?;
        write(
            &data.join("pg_hba.conf"),
            "local all all trust\nhostssl certdb all 127.0.0.1/32 cert\n\
             hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl all all ::1/128 scram-sha-256\n",
        )?;
        if cluster.as_postgres {
            for f in ["server.crt", "server.key", "root.crt", "pg_hba.conf"] {
                let out = Command::new("chown")
                    .arg("postgres:postgres")
                    .arg(data.join(f))
                    .output()
                    .map_err(|e| format!("chown: {e}"))?;
                if !out.status.success() {
                    return Err(String::from_utf8_lossy(&out.stderr).into_owned());
                }
            }
        }
        let tls = Tls {
            ca: cluster.dir.path().join("ca.pem"),
            other_ca: cluster.dir.path().join("other-ca.pem"),
            client_cert: cluster.dir.path().join("client.pem"),
            client_key: cluster.dir.path().join("client.key"),
        };
        write(&tls.client_cert, &client_cert.pem())?;
        write(&tls.client_key, &client_key.serialize_pem())?;
        write(&tls.ca, &ca_cert.pem())?;
        write(&tls.other_ca, &other_cert.pem())?;
        cluster.tls = true;
        cluster.resume()?;
        Ok((cluster, tls))
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let out = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Stops the cluster when this process is gone (a shell in a session of its own).
    fn watchdog(&self) -> Result<(), String> {
        let pg_ctl = self.bin.join("pg_ctl");
        let stop = if self.as_postgres {
            format!("runuser -u postgres -- {}", pg_ctl.display())
        } else {
            pg_ctl.display().to_string()
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             pm=$(head -n 1 '{data}/postmaster.pid' 2>/dev/null); \
             [ -n \"$pm\" ] && kill -CONT $pm $(pgrep -P $pm) 2>/dev/null; {stop} -D '{data}' stop -m immediate >/dev/null 2>&1; rm -rf '{dir}'",
            pid = std::process::id(),
            data = self.data().display(),
            dir = self.dir.path().display(),
        );
        Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(|_| ())
            .map_err(|e| format!("starting the cluster's watchdog: {e}"))
    }

    /// Starts the (stopped) cluster and waits until it accepts connections.
    pub fn resume(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=300{}",
            self.port,
            self.data().display(),
            if self.tls {
                " -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key \
                 -c ssl_ca_file=root.crt"
            } else {
                ""
            }
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data())?,
                "-l",
                path_str(&self.dir.path().join("log"))?,
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .map_err(|e| format!("{e}\nserver log:\n{}", self.log()))
    }

    /// Stops the cluster (`fast`: connections are cut, the server shuts down cleanly).
    pub fn pause(&self) -> Result<(), String> {
        self.run(
            "pg_ctl",
            &["-D", path_str(&self.data())?, "-m", "fast", "-w", "stop"],
        )
    }

    /// The cluster's processes: the postmaster (its `postmaster.pid`) and its children.
    fn processes(&self) -> Vec<i32> {
        let Some(main) = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
        else {
            return vec![];
        };
        let mut pids = vec![main];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(main) {
                pids.push(pid);
            }
        }
        pids
    }

    fn signal(&self, signal: i32) {
        for pid in self.processes() {
            // SAFETY: kill only reads its integer arguments.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// Stops every process of the cluster (SIGSTOP) until the guard is dropped (SIGCONT): a
    /// database that stops answering without closing its connections (a frozen machine, a
    /// network cut without a reset). The guard resumes it when a test fails too.
    pub fn freeze(&self) -> Frozen<'_> {
        self.signal(libc::SIGSTOP);
        // A backend forked while the postmaster was being stopped.
        self.signal(libc::SIGSTOP);
        Frozen(self)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// The URL of database `db` (with the password).
    pub fn url(&self, db: &str) -> String {
        format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{db}", self.port)
    }

    /// A new, empty database; its URL.
    pub async fn database(&self) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let (client, connection) =
            tokio_postgres::connect(&self.url("postgres"), tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| panic!("connecting to the test cluster: {e}\n{}", self.log()));
        let task = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        drop(client);
        let _ = task.await;
        self.url(&name)
    }
}

/// A frozen cluster ([`Cluster::freeze`]); resumed when dropped.
pub struct Frozen<'a>(&'a Cluster);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.signal(libc::SIGCONT);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A stopped postmaster would not hear `pg_ctl stop`.
        self.signal(libc::SIGCONT);
        if let Ok(data) = path_str(&self.data()) {
            let _ = self.run("pg_ctl", &["-D", data, "-m", "immediate", "-w", "stop"]);
        }
    }
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))
}

/// The cluster shared by the tests that only need a database of their own; started on first
/// use. Panics with the reason when it cannot start.
pub fn shared() -> &'static Cluster {
    static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();
    match SHARED.get_or_init(Cluster::start) {
        Ok(c) => c,
        Err(e) => panic!("this test needs PostgreSQL, which could not be started: {e}"),
    }
}

/// A fresh database on the shared cluster; its URL.
pub async fn database() -> String {
    shared().database().await
}
