//! Work beside the watches and the reconciles: forgetting deleted
//! Services, the start-up LIST of native Endpoints, readiness, and the
//! cache sizes read at each scrape.

use super::*;

pub(super) fn spawn(
    tasks: &mut JoinSet<()>,
    ctx: &Arc<Context>,
    opts: &RunOptions,
    mut gone: UnboundedReceiver<Arc<Service>>,
) {
    {
        let ctx = ctx.clone();
        tasks.spawn(async move {
            while let Some(svc) = gone.recv().await {
                ctx.forget_service(&svc);
            }
        });
    }

    // Native Endpoints, listed once so that the cold start's migration
    // cleanup does not GET one per Service; reconciles wait for it like for
    // the watches' first lists.
    if ctx.config.native_cleanup {
        let mut listed = ctx.synced.register();
        let ctx = ctx.clone();
        let namespaces = opts.namespaces.clone();
        tasks.spawn(async move {
            ctx.migration.prime(&namespaces).await;
            listed.complete();
        });
    }

    // Readiness: flip once every watch has listed once.
    if let Some(ready) = opts.ready.clone() {
        let gate = ctx.synced.clone();
        tasks.spawn(async move {
            gate.opened().await;
            ready.set_ready(true);
        });
    }

    let (services, pods, slices, nodes) = (
        ctx.services.clone(),
        ctx.pods.clone(),
        ctx.slices.clone(),
        ctx.nodes.clone(),
    );
    opts.metrics.caches.read_from(move || {
        let mut rows = vec![
            ("services", services.len()),
            ("pods", pods.len()),
            ("endpointslices", slices.len()),
        ];
        rows.extend(nodes.as_ref().map(|n| ("nodes", n.len())));
        rows
    });
}
