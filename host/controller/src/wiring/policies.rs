//! The `MembershipPolicy` watch and the task that keeps the policy book
//! ([`crate::policies::Book`]): each object read, built and given a status;
//! the Services of its namespace asked for again when it changes.
//!
//! Why one task reads every object in turn: building may pull a module
//! from a registry, which must not hold up the watch; and the budget of a
//! namespace (`maxPerNamespace`) depends on its other objects, which one
//! reader sees in order. Reconciles wait for the first list to be read and
//! built (a sync token of their gate), so that no Service is judged by
//! `membership` at start when an object of its namespace selects it.

use std::collections::BTreeMap;

use kube::api::{Api, ResourceExt};
use portwise_api::MembershipPolicy;
use portwise_checkers::WasmCheckers;
use portwise_core::{
    config::PolicyLimits,
    policy::{self, Policy},
};

use crate::{
    cache::SyncToken,
    policies::{
        Entry, Verdict,
        read::{self, reason},
        status,
    },
};

use super::*;

/// A change the watch saw.
pub(super) enum Change {
    Applied(Arc<MembershipPolicy>),
    Deleted(Arc<MembershipPolicy>),
}

/// The watch's parts: its cache, the stream that fills it, the changes in
/// order, and the gate its first list opens.
pub(super) struct PolicyWatch {
    pub(super) store: Store<MembershipPolicy>,
    pub(super) stream: BoxFuture<'static, ()>,
    pub(super) changes: UnboundedReceiver<Change>,
    pub(super) listed: SyncGate,
}

/// Watches the policy objects of the chosen namespaces.
pub(super) fn watch(client: &Client, namespaces: &[String], cfg: &watcher::Config) -> PolicyWatch {
    let (store, writer) = reflector::store::<MembershipPolicy>();
    let (tx, changes) = unbounded_channel();
    let listed = SyncGate::default();
    let stream = watch_all::<MembershipPolicy>(client, namespaces, cfg.clone(), &listed, |_| true)
        .modify(cache::strip_managed_fields)
        .reflect(writer)
        .for_each(move |ev| {
            match ev {
                Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => {
                    let _ = tx.send(Change::Applied(Arc::new(p)));
                }
                Ok(watcher::Event::Delete(p)) => {
                    let _ = tx.send(Change::Deleted(Arc::new(p)));
                }
                Ok(_) => {}
                // Reconciles wait for the first list (never judge a
                // Service by `membership` that an unseen policy selects):
                // say what to fix.
                Err(e) => {
                    warn!(error = %e, "cannot watch MembershipPolicies (is the CRD installed, \
                    and may portwise list them?); reconciles wait for their first list")
                }
            }
            future::ready(())
        })
        .boxed();
    PolicyWatch {
        store,
        stream,
        changes,
        listed,
    }
}

/// What the keeper needs besides the context.
pub(super) struct Keeper {
    pub(super) client: Client,
    pub(super) limits: PolicyLimits,
    pub(super) wasm: Option<Arc<dyn WasmCheckers>>,
    pub(super) triggers: Triggers,
    /// Held until the first list is read and built.
    pub(super) token: SyncToken,
}

/// Reads every change in turn into the book, asks for the Services of its
/// namespace, and writes statuses; every `resyncPeriod`, brings every
/// status up to date (Service counts move with the Services, and a new
/// leader writes what its predecessor could not).
pub(super) async fn keep(ctx: Arc<Context>, watch: PolicyWatch, mut keeper: Keeper) {
    let PolicyWatch {
        store,
        mut changes,
        listed,
        ..
    } = watch;
    let mut resync = tokio::time::interval(ctx.config.resync_period);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut first_list = true;
    // Statuses wait for every cache (Services included) to have listed:
    // the counts read them.
    let mut statuses_due = true;
    loop {
        tokio::select! {
            change = changes.recv() => {
                let Some(change) = change else { return };
                let ns = match &change {
                    Change::Applied(p) | Change::Deleted(p) => p.namespace().unwrap_or_default(),
                };
                match change {
                    Change::Applied(p) => {
                        if !read_one(&ctx, &keeper, &store, &p, false).await {
                            // Nothing changed that a Service could see.
                            sync_statuses(&ctx, &keeper, &store, Some(&ns)).await;
                            continue;
                        }
                    }
                    Change::Deleted(p) => {
                        ctx.book.remove(&ns, &p.name_any());
                        // One gone may let a newer one within the budget.
                        for other in store.state().iter().filter(|o| o.namespace().as_deref() == Some(&ns)) {
                            read_one(&ctx, &keeper, &store, other, true).await;
                        }
                    }
                }
                ask_namespace(&ctx, &keeper.triggers, &ns);
                sync_statuses(&ctx, &keeper, &store, Some(&ns)).await;
            }
            () = listed.opened(), if first_list => {}
            () = ctx.synced.opened(), if !first_list && statuses_due => {
                statuses_due = false;
                sync_statuses(&ctx, &keeper, &store, None).await;
            }
            _ = resync.tick() => sync_statuses(&ctx, &keeper, &store, None).await,
        }
        if first_list && listed.synced() && changes.is_empty() {
            first_list = false;
            keeper.token.complete();
            info!(policies = store.len(), "membership policies read");
        }
    }
}

/// Reads `obj` into the book unless the book has this generation already
/// (`again`: read it anyway, its budget may have changed). Whether the
/// book changed.
async fn read_one(
    ctx: &Context,
    keeper: &Keeper,
    store: &Store<MembershipPolicy>,
    obj: &MembershipPolicy,
    again: bool,
) -> bool {
    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    let uid = obj.uid().unwrap_or_default();
    let generation = obj.metadata.generation.unwrap_or_default();
    let previous = ctx.book.get(&ns, &name);
    if let Some(p) = &previous
        && p.uid == uid
        && p.generation == generation
        // A refusal may depend on the namespace's other objects (its
        // budgets): read it again when one goes.
        && !(again && matches!(p.accepted, Verdict::Refused { .. }))
    {
        return false;
    }
    let created = crate::policies::created(obj);
    let mut entry = Entry {
        uid,
        generation,
        created,
        selector: None,
        accepted: Verdict::Ok(String::new()),
        modules: None,
        checker: None,
        shadow: None,
        named_modules: Vec::new(),
    };
    let max = keeper.limits.max_per_namespace;
    let state = store.state();
    let in_ns = state
        .iter()
        .filter(|o| o.namespace().as_deref() == Some(&ns))
        .map(|o| o.as_ref());
    if crate::policies::past_budget(in_ns, max).contains(&name) {
        entry.accepted = Verdict::Refused {
            reason: reason::TOO_MANY,
            message: format!(
                "namespace {ns} has more than {max} MembershipPolicies (the operator's \
                 membershipPolicies.maxPerNamespace); the newest are not read"
            ),
        };
    } else {
        match read::accept(&obj.spec, &keeper.limits) {
            Err(refused) => entry.accepted = refused,
            Ok(accepted) => {
                let mine = accepted.modules();
                if let Err(over) = portwise_core::policy::with_modules(
                    &ctx.book.modules_in(&ns, &name),
                    mine.iter().cloned(),
                    keeper.limits.max_modules_per_namespace,
                ) {
                    entry.accepted = Verdict::Refused {
                        reason: reason::NOT_ALLOWED,
                        message: format!("spec: in namespace {ns}, {over}"),
                    };
                    ctx.book.set(&ns, &name, entry);
                    return true;
                }
                entry.named_modules = mine;
                entry.selector = accepted.selector.clone();
                entry.accepted = Verdict::Ok(String::new());
                match read::build(&accepted, keeper.wasm.as_deref(), ctx.config.resync_period).await
                {
                    Ok(built) => {
                        entry.modules = Some(Verdict::Ok(String::new()));
                        entry.checker = Some((built.membership, ctx.book.next_revision()));
                        entry.shadow = built.shadow;
                    }
                    Err(refused) => entry.modules = Some(refused),
                }
            }
        }
    }
    match (&entry.accepted, &entry.modules) {
        (Verdict::Refused { message, .. }, _) | (_, Some(Verdict::Refused { message, .. })) => {
            warn!(namespace = %ns, policy = %name, generation, "{message}")
        }
        _ => info!(namespace = %ns, policy = %name, generation, "membership policy ready"),
    }
    ctx.book.set(&ns, &name, entry);
    true
}

/// Asks for every Service of `ns`: its policy objects changed.
fn ask_namespace(ctx: &Context, triggers: &Triggers, ns: &str) {
    for svc in ctx.services.state() {
        if svc.namespace().as_deref() == Some(ns) {
            triggers.ask(ObjectRef::from_obj(svc.as_ref()));
        }
    }
}

/// Writes the status of every object of `ns` (all namespaces: `None`) that
/// differs from what it should be. The leader's job only.
async fn sync_statuses(
    ctx: &Context,
    keeper: &Keeper,
    store: &Store<MembershipPolicy>,
    ns: Option<&str>,
) {
    // A standby writes no status: it does not count either.
    if !ctx.synced.synced() || !ctx.leader.writes_anywhere() {
        return;
    }
    // Sharded, each object's status is its namespace's holder's to write.
    let objects: Vec<Arc<MembershipPolicy>> = store
        .state()
        .into_iter()
        .filter(|o| ns.is_none_or(|ns| o.namespace().as_deref() == Some(ns)))
        .filter(|o| ctx.leads(&o.namespace().unwrap_or_default()))
        .collect();
    let mut counts: BTreeMap<(String, String), i32> = BTreeMap::new();
    for svc in ctx.services.state() {
        if svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName")
            || key_value(&svc.metadata, &ctx.config.service_key).is_none()
        {
            continue;
        }
        let svc_ns = svc.namespace().unwrap_or_default();
        if ns.is_some_and(|ns| ns != svc_ns) {
            continue;
        }
        if let Ok(Policy::Object(name)) = policy::choose(&svc, &ctx.config, &ctx.book.objects(&svc))
        {
            *counts.entry((svc_ns, name)).or_default() += 1;
        }
    }
    for obj in objects {
        let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
        let Some(entry) = ctx.book.get(&ns, &name) else {
            continue;
        };
        // The object may have moved on since it was read: its status
        // describes the generation read.
        if entry.uid != obj.uid().unwrap_or_default() {
            continue;
        }
        let services = counts.get(&(ns.clone(), name)).copied().unwrap_or(0);
        let desired = status::desired(&obj, &entry, services);
        let api: Api<MembershipPolicy> = Api::namespaced(keeper.client.clone(), &ns);
        status::write(&api, &obj, desired, &ctx.config.managed_by).await;
    }
}
