//! The live judge and the shadows, each policy's checker built (and so
//! validated) at start.

use super::*;

/// The live judge, with a checker per policy (`membership` included) and
/// the policy objects' of `book`, and the shadows if the configuration has
/// any or lets objects bring theirs. Both keep their verdicts in
/// `table`.
pub(super) async fn build(
    config: &Config,
    opts: &RunOptions,
    table: &Arc<ServiceTable>,
    book: &Arc<crate::policies::Book>,
) -> Result<(Judge, Option<Arc<Shadows>>), Error> {
    let build_ctx = BuildContext {
        wasm: opts.wasm.as_deref(),
        stable_ttl: BuildContext::stable_ttl_for(config.resync_period),
        stable_spacing: BuildContext::stable_spacing_for(config.resync_period),
    };
    let mut checkers = crate::judge::Checkers::new();
    let membership: Arc<dyn Checker> = portwise_checkers::build(&config.membership, &build_ctx)
        .await
        .map_err(Error::Build)?;
    checkers.insert(Policy::Default, membership);
    for (name, expr) in &config.policies {
        let policy = Policy::Named(name.clone());
        let checker: Arc<dyn Checker> =
            portwise_checkers::build_at(expr, &build_ctx, &policy.label())
                .await
                .map_err(Error::Build)?;
        checkers.insert(policy, checker);
    }
    let judge = Judge::new(
        checkers,
        config.max_concurrent_checks,
        opts.check_timeout,
        config.resync_period,
        config.abstain_limit(),
        opts.metrics.clone(),
        table.clone(),
    )
    // No namespace holds more than its cap of the live checks' permits.
    .sharing_permits(crate::permits::FairPermits::capped(
        config.max_concurrent_checks,
        config
            .max_concurrent_checks_per_namespace
            .unwrap_or(config.max_concurrent_checks),
    ))
    .with_book(book.clone());
    // maxConcurrentChecks bounds the live checks; the shadows share a pool
    // of the same size of their own, so a slow shadow never takes a live
    // check's place.
    let shadow_permits = crate::permits::FairPermits::capped(
        config.max_concurrent_checks,
        config
            .max_concurrent_checks_per_namespace
            .unwrap_or(config.max_concurrent_checks),
    );
    let shadows = Shadows::build(
        config,
        &build_ctx,
        (table.clone(), book.clone()),
        |checkers| {
            crate::shadow::shadow_judge(
                checkers,
                config,
                opts.check_timeout,
                opts.metrics.clone(),
                shadow_permits.clone(),
                table.clone(),
            )
        },
    )
    .await?
    .map(Arc::new);
    Ok((judge, shadows))
}
