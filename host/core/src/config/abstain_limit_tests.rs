use super::*;

#[test]
fn abstain_limit_defaults_to_five_minutes_or_two_periods_and_is_checked() {
    let c = Config::from_yaml("serviceKey: {label: g}\n").unwrap();
    assert_eq!(c.abstain_limit(), Duration::from_secs(300));
    let c = Config::from_yaml("serviceKey: {label: g}\nresyncPeriod: 10m\n").unwrap();
    assert_eq!(
        c.abstain_limit(),
        Duration::from_secs(1200),
        "a valid file stays valid"
    );
    let c = Config::from_yaml("serviceKey: {label: g}\nabstainLimit: 90s\n").unwrap();
    assert_eq!(c.abstain_limit(), Duration::from_secs(90));
    let e = Config::from_yaml("serviceKey: {label: g}\nabstainLimit: 10s\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("abstainLimit") && e.contains("resyncPeriod"),
        "{e}"
    );
    let e = Config::from_yaml("serviceKey: {label: g}\nabstainLimit: later\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("abstainLimit"), "{e}");
}
