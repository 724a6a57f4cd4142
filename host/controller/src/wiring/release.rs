//! Services that leave the Service cache but not the cluster: their slices
//! are taken back ([`release_gone`]), and at start and on each term our
//! slices of Services the cache does not hold are looked at
//! ([`sweep_gone`]).

use super::*;

fn controller_owner(slice: &EndpointSlice) -> Option<&OwnerReference> {
    slice
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Service")
}

/// The Service a slice belongs to, by controller owner or by label.
pub(super) fn slice_service(slice: &EndpointSlice) -> Option<String> {
    controller_owner(slice)
        .map(|o| o.name.clone())
        .or_else(|| slice.labels().get(SERVICE_NAME_LABEL).cloned())
}
/// A Service that left the Service cache, for [`release_gone`].
pub(super) enum Gone {
    /// It lost its key: the object as the watch last showed it.
    Lost(Arc<Service>),
    /// Deleted, or may have lost its key (a label-selected watch reports
    /// that as a delete; a relist cannot tell): ask the apiserver.
    Check(ObjectRef<Service>),
}

/// Takes back the slices of Services that left the Service cache but not
/// the cluster. The cache holds only keyed Services, so a Service that
/// loses its key is dropped from it, and the queue never
/// reconciles an object its store lacks; this reconciles it here instead,
/// which releases it like any unmanaged Service (`decide`'s branch 2). A
/// deleted Service needs nothing: its slices have it as their controller
/// owner, and the garbage collector removes them.
pub(super) async fn release_gone(
    client: Client,
    ctx: Arc<Context>,
    tx: tokio::sync::mpsc::UnboundedSender<Gone>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Gone>,
) {
    while let Some(gone) = rx.recv().await {
        // Only the complete caches can tell what we own.
        ctx.synced.opened().await;
        let r = match &gone {
            Gone::Lost(svc) => ObjectRef::from_obj(svc.as_ref()),
            Gone::Check(r) => r.clone(),
        };
        let ns = r.namespace.clone().unwrap_or_default();
        if ctx.services.get(&r).is_some() || ctx.slice_owners.members(&ns, &r.name).is_empty() {
            // Back in the cache (it is served), or nothing of ours to take.
            continue;
        }
        let svc = match gone {
            Gone::Lost(svc) => svc,
            Gone::Check(_) => {
                let api: Api<Service> = Api::namespaced(client.clone(), &ns);
                match api.get_opt(&r.name).await {
                    Ok(Some(svc))
                        if key_value(&svc.metadata, &ctx.config.service_key).is_none() =>
                    {
                        Arc::new(svc)
                    }
                    // Keyed: the watch delivers it. Gone: the garbage
                    // collector takes its slices.
                    Ok(_) => continue,
                    Err(e) => {
                        retry_gone(&ctx, &tx, r, &e.to_string());
                        continue;
                    }
                }
            }
        };
        info!(service = %r, "Service left the cache but not the cluster: releasing it");
        if let Err(e) = reconcile_outside(svc, ctx.clone()).await {
            retry_gone(&ctx, &tx, r, &e.to_string());
        }
    }
}

fn retry_gone(
    ctx: &Context,
    tx: &tokio::sync::mpsc::UnboundedSender<Gone>,
    r: ObjectRef<Service>,
    error: &str,
) {
    let (delay, _) = ctx.table.failed(&r);
    warn!(service = %r, error, retry_in = ?delay, "releasing a Service that left the cache");
    let tx = tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let _ = tx.send(Gone::Check(r));
    });
}

/// Our slices whose Service is not in the Service cache: it lost its key
/// while we were not looking (down, or following).
pub(super) fn sweep_gone(ctx: &Context, tx: &tokio::sync::mpsc::UnboundedSender<Gone>) {
    let mut seen = std::collections::HashSet::new();
    for slice in ctx.slices.state() {
        let Some(svc) = slice_service(&slice) else {
            continue;
        };
        let ns = slice.namespace().unwrap_or_default();
        if !ctx.leads(&ns) {
            continue;
        }
        let r = ObjectRef::<Service>::new(&svc).within(&ns);
        if ctx.services.get(&r).is_none() && seen.insert(r.clone()) {
            let _ = tx.send(Gone::Check(r));
        }
    }
}
