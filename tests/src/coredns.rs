//! CoreDNS built from upstream (tests/coredns) serving the cluster domain
//! from the control plane, and DNS queries to it (the wire format from
//! hickory-proto, no resolver). Behind the `dns` feature: the demo driver
//! does not query DNS.

use std::{
    fs::File,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use hickory_proto::{
    op::{Message, MessageType, OpCode, Query, ResponseCode},
    rr::{Name, RData, RecordType},
    serialize::binary::{BinDecodable, BinEncodable},
};
use tokio::net::UdpSocket;

use crate::{ControlPlane, Metrics, free_port, http_get};

/// The cluster domain CoreDNS serves.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// A running CoreDNS serving [`CLUSTER_DOMAIN`] from the control plane.
#[derive(Debug)]
pub struct CoreDns {
    child: Child,
    dns: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// tests/coredns/build: the cached CoreDNS binary, built if need be.
pub fn coredns_binary() -> Result<PathBuf> {
    crate::control_plane::built_tool("tests/coredns/build")
}

impl CoreDns {
    /// Starts CoreDNS with the `kubernetes` plugin and returns once it says
    /// it is ready (its caches have synced).
    pub async fn start(cp: &ControlPlane) -> Result<Self> {
        let bin = tokio::task::spawn_blocking(coredns_binary).await??;
        let dir = tempfile::Builder::new().prefix("coredns-").tempdir()?;
        let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let ready = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let corefile = dir.path().join("Corefile");
        std::fs::write(
            &corefile,
            format!(
                "{CLUSTER_DOMAIN}:{port} {{\n\
                 \x20   bind {ip}\n\
                 \x20   errors\n\
                 \x20   log\n\
                 \x20   prometheus {metrics}\n\
                 \x20   ready {ready}\n\
                 \x20   kubernetes {CLUSTER_DOMAIN} {{\n\
                 \x20       kubeconfig {kubeconfig}\n\
                 \x20   }}\n\
                 }}\n",
                port = dns.port(),
                ip = dns.ip(),
                kubeconfig = cp.kubeconfig().display(),
            ),
        )?;
        let log = dir.path().join("coredns.log");
        let child = Command::new(&bin)
            .arg("-conf")
            .arg(&corefile)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(File::create(&log)?)
            .stderr(File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut coredns = CoreDns {
            child,
            dns,
            metrics,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = coredns.child.try_wait()? {
                bail!("coredns exited with {status}\n{}", coredns.log_text());
            }
            if matches!(http_get(ready, "/ready").await, Ok((200, _))) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "CoreDNS not ready within 60 s; log:\n{}",
                    coredns.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(coredns)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CoreDNS's log so far, for failure messages.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// CoreDNS's `/metrics`.
    pub async fn metrics(&self) -> Result<Metrics> {
        let (status, body) = http_get(self.metrics, "/metrics").await?;
        if status != 200 {
            bail!("CoreDNS /metrics answered {status}");
        }
        Ok(Metrics::parse(&body))
    }

    /// One query over UDP (with a retry, UDP being UDP).
    pub async fn query(&self, name: &str, rtype: RecordType) -> Result<Answer> {
        let mut last = None;
        for _ in 0..3 {
            match self.query_once(name, rtype).await {
                Ok(a) => return Ok(a),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried"))
    }

    async fn query_once(&self, name: &str, rtype: RecordType) -> Result<Answer> {
        let mut msg = Message::new();
        msg.set_id(fastrand::u16(..))
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Query)
            .set_recursion_desired(false)
            .add_query(Query::query(Name::from_ascii(name)?, rtype));
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        sock.send_to(&msg.to_bytes()?, self.dns).await?;
        let mut buf = vec![0u8; 65535];
        let n = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf))
            .await
            .with_context(|| format!("no DNS answer for {name} {rtype}"))??;
        let reply = Message::from_bytes(&buf[..n])?;
        if reply.id() != msg.id() {
            bail!("DNS answer for another query");
        }
        let mut answer = Answer {
            code: reply.response_code(),
            ..Default::default()
        };
        for rr in reply.answers() {
            match rr.data() {
                RData::A(a) => answer.addresses.push(IpAddr::V4(a.0)),
                RData::AAAA(a) => answer.addresses.push(IpAddr::V6(a.0)),
                RData::SRV(srv) => answer.srv.push((srv.target().to_ascii(), srv.port())),
                _ => {}
            }
        }
        answer.addresses.sort();
        answer.srv.sort();
        Ok(answer)
    }
}

impl Drop for CoreDns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a DNS query returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub code: ResponseCode,
    /// A and AAAA records, sorted.
    pub addresses: Vec<IpAddr>,
    /// SRV records as (target, port), sorted.
    pub srv: Vec<(String, u16)>,
}

/// `_port._tcp.svc.ns.svc.cluster.local.`
pub fn srv_name(port: &str, svc: &str, ns: &str) -> String {
    format!("_{port}._tcp.{svc}.{ns}.svc.{CLUSTER_DOMAIN}.")
}

/// `svc.ns.svc.cluster.local.`
pub fn service_name(svc: &str, ns: &str) -> String {
    format!("{svc}.{ns}.svc.{CLUSTER_DOMAIN}.")
}
