//! Network partitions between one portwise process and the apiserver,
//! made with nftables inside the test's network namespace.
//!
//! Every process in the namespace reaches the apiserver at the same
//! address, so a rule on that address would cut everyone. Instead each
//! replica gets a [`Route`]: a port of its own on 127.0.0.1 that a `nat`
//! rule rewrites to the apiserver's port. Cutting a route drops every
//! packet of every connection made through it, in both directions (the
//! rule matches the connection's original destination, which replies share),
//! so the replica sees what a real partition looks like: no RST, no
//! refusal, only silence, and TCP retransmitting whatever it had sent.
//!
//! Only inside a namespace a test made (`tests/netns`, [`crate::faults::isolated`]):
//! the table is refused anywhere else.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use kube::config::Kubeconfig;
use tokio::io::AsyncWriteExt;

use crate::{
    ControlPlane,
    faults::apiserver_port,
    identity::{kubeconfig_variant, service_account_token, token_kubeconfig},
    kubectl,
};

const TABLE: &str = "portwise-partitions";
/// The table is made once per process (one test per namespace).
static TABLE_MADE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// A route from one client to the apiserver that can be cut and healed.
#[derive(Debug)]
pub struct Route {
    port: u16,
}

impl Route {
    /// A new local port that leads to `cp`'s apiserver.
    pub async fn new(cp: &ControlPlane) -> Result<Self> {
        ensure!(
            std::env::var("PORTWISE_NETNS").as_deref() == Ok("1"),
            "partitions are made only inside a test network namespace (tests/netns)"
        );
        let upstream = apiserver_port(cp)?;
        let port = crate::free_port()?;
        TABLE_MADE
            .get_or_try_init(|| async {
                nft(&format!(
                    "table inet {TABLE} {{\n\
                       set cut {{ type inet_service; }}\n\
                       chain nat_out {{ type nat hook output priority -100; }}\n\
                       chain drop_out {{ type filter hook output priority 0; \
                         meta l4proto tcp ct original proto-dst @cut drop; }}\n\
                     }}\n"
                ))
                .await
            })
            .await?;
        nft(&format!(
            "add rule inet {TABLE} nat_out ip daddr 127.0.0.1 tcp dport {port} dnat ip to 127.0.0.1:{upstream}\n"
        ))
        .await?;
        Ok(Self { port })
    }

    /// The URL a client uses for this route.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Drops every packet on this route from now on.
    pub async fn cut(&self) -> Result<()> {
        nft(&format!(
            "add element inet {TABLE} cut {{ {} }}\n",
            self.port
        ))
        .await
    }

    /// Lets packets through again; connections that TCP has not given up on
    /// carry on where they were.
    pub async fn heal(&self) -> Result<()> {
        nft(&format!(
            "delete element inet {TABLE} cut {{ {} }}\n",
            self.port
        ))
        .await
    }

    /// A copy of `kubeconfig` that reaches the apiserver through this route.
    pub fn kubeconfig(&self, cp: &ControlPlane, kubeconfig: &Path, out: &Path) -> Result<PathBuf> {
        let mut kc = Kubeconfig::read_from(kubeconfig)?;
        for c in &mut kc.clusters {
            if let Some(cluster) = c.cluster.as_mut() {
                cluster.server = Some(self.url());
            }
        }
        // Through `kubeconfig_variant` so every kubeconfig a test writes has
        // one origin; the admin copy is replaced wholesale.
        kubeconfig_variant(cp, out, move |admin| *admin = kc)
    }
}

/// `nft -f -` with `script`; fails with nft's message. Only inside a test
/// network namespace.
pub async fn nft(script: &str) -> Result<()> {
    let mut child = tokio::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running nft (tests/setup installs nftables)")?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(script.as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    ensure!(
        out.status.success(),
        "nft -f failed ({}):\n{script}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// ServiceAccount `portwise-system/NAME` with deploy/'s ClusterRole and
/// leader-election Role, and a kubeconfig for it (a 2h token): a replica
/// with an identity of its own in the audit log, and exactly the rights
/// the real deployment gives.
pub async fn replica_identity(cp: &ControlPlane, name: &str) -> Result<(String, PathBuf)> {
    crate::identity::portwise_identity(cp).await?;
    let manifest = format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {name}, namespace: portwise-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: portwise}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: portwise-system}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}-leader-election, namespace: portwise-system}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: portwise-leader-election}}
subjects: [{{kind: ServiceAccount, name: {name}, namespace: portwise-system}}]
"#
    );
    kubectl(cp, &["apply", "-f", "-"], Some(&manifest)).await?;
    let token = service_account_token(cp, "portwise-system", name, "2h").await?;
    let path = token_kubeconfig(cp, &cp.dir().join(format!("{name}.kubeconfig")), &token)?;
    Ok((
        format!("system:serviceaccount:portwise-system:{name}"),
        path,
    ))
}

/// The chart's Role for the shard ring's Leases when `shards` is above 1
/// (deploy/helm/templates/rbac.yaml), bound to ServiceAccount
/// `portwise-system/SA`: a sharded replica needs it besides
/// [`replica_identity`]'s rights.
pub async fn ring_rights(cp: &ControlPlane, sa: &str) -> Result<()> {
    let manifest = format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: portwise-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: portwise-shards, namespace: portwise-system}}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [list, get, update, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {sa}-shards, namespace: portwise-system}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: portwise-shards}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: portwise-system}}]
"#
    );
    kubectl(cp, &["apply", "-f", "-"], Some(&manifest)).await?;
    Ok(())
}

/// One `portwise run --leader-elect` process (Leases in `portwise-system`)
/// as ServiceAccount `portwise-ID` ([`replica_identity`]), reaching the
/// apiserver through a [`Route`] of its own: the audit log names what it
/// does, and a test can cut it off.
pub struct Replica {
    pub proc: crate::Portwise,
    /// Its user, as the audit log names it.
    pub user: String,
    pub route: Route,
}

impl Replica {
    /// Starts replica `id` with a `lease_secs` Lease; `launch` adds the
    /// rest (namespaces, config, flags). Returns once it is ready (listed
    /// and serving metrics), leading or not.
    pub async fn start(
        cp: &'static ControlPlane,
        id: &str,
        lease_secs: u64,
        launch: impl FnOnce(crate::Launch) -> crate::Launch,
    ) -> Result<Self> {
        let (user, kubeconfig) = replica_identity(cp, &format!("portwise-{id}")).await?;
        let route = Route::new(cp).await?;
        let kubeconfig = route.kubeconfig(
            cp,
            &kubeconfig,
            &cp.dir().join(format!("{id}-route.kubeconfig")),
        )?;
        let proc = launch(
            crate::Portwise::builder(cp)
                .name(id)
                .identity(&kubeconfig)
                .leader_elect("portwise-system", lease_secs, id),
        )
        .start()
        .await?;
        let mut r = Self { proc, user, route };
        r.proc.wait_ready().await?;
        Ok(r)
    }

    /// Whether it says it leads (`portwise_leader`).
    pub async fn leads(&self) -> Result<bool> {
        Ok(self.proc.scrape().await?.value("portwise_leader", &[])? == Some(1.0))
    }

    /// Its requests since `audit`'s mark that change anything but a Lease
    /// (slices, Endpoints, Events), and its Lease writes.
    pub fn writes(
        &self,
        audit: &crate::faults::Audit,
    ) -> Result<(
        Vec<crate::faults::AuditEvent>,
        Vec<crate::faults::AuditEvent>,
    )> {
        Ok(audit
            .by_user(&self.user)?
            .into_iter()
            .filter(crate::faults::AuditEvent::is_write)
            .partition(|e| e.resource != "leases"))
    }
}
