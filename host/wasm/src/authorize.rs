//! Where a guest's probe may go: the probe policy, as a pure function of the
//! call's scope and the probe asked for.
//!
//! The rule that matters: a guest's probes reach **only the address under
//! judgement**. Hosts are compared as parsed IP addresses (names are never
//! resolved), a `hostNetwork` pod (whose address is its Node's) is reachable
//! only on the ports its Service resolves there, and a call has a cap on its
//! probes. It is kept apart from the store's state so that the policy can be
//! read, and tested, without a store, a runtime or a guest.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
};

/// What one call's probes may reach.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scope<'a> {
    /// The address under judgement, canonical; `None` during
    /// validate-config, which judges nothing.
    pub address: Option<IpAddr>,
    /// The ports probes may reach there; `None`: any.
    pub ports: Option<&'a BTreeSet<u16>>,
    /// The call's cap on probes.
    pub max_probes: u32,
}

/// Why a probe is refused. The text is what the guest gets in
/// `probe-error.denied` and what the log says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Denial {
    #[error("probes are not available during validate-config")]
    NoAddress,
    #[error("port 0")]
    PortZero,
    #[error("more than {0} probes in one call")]
    TooMany(u32),
    #[error(
        "{address} is a hostNetwork pod's, its Node's: probes may reach only the ports \
         its Service resolves there ({}), not {port}",
        list(allowed)
    )]
    HostNetworkPort {
        address: IpAddr,
        allowed: Vec<u16>,
        port: u16,
    },
    #[error("probes may reach only the address under judgement ({address}), not {asked}")]
    OtherAddress { address: IpAddr, asked: IpAddr },
    #[error("host {0:?} is not an IP address (names are never resolved)")]
    NotAnAddress(String),
}

fn list(ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    ports.join(", ")
}

impl Denial {
    /// Whether the refused probe counts against the call's cap. Only a
    /// probe refused before it names anywhere reachable (no address to
    /// judge, port 0) does not: everything else a guest tries counts, so
    /// trying other addresses cannot go on past the cap.
    pub(crate) fn counts(&self) -> bool {
        !matches!(self, Denial::NoAddress | Denial::PortZero)
    }
}

/// Decides where the `nth` probe of a call (counting from 1, this one
/// included) to `host`:`port` goes, or why it may not. An empty `host`
/// means the address under judgement.
pub(crate) fn authorize(
    scope: &Scope<'_>,
    nth: u32,
    host: &str,
    port: u16,
) -> Result<SocketAddr, Denial> {
    let Some(address) = scope.address else {
        return Err(Denial::NoAddress);
    };
    if port == 0 {
        return Err(Denial::PortZero);
    }
    if nth > scope.max_probes {
        return Err(Denial::TooMany(scope.max_probes));
    }
    if let Some(ports) = scope.ports
        && !ports.contains(&port)
    {
        return Err(Denial::HostNetworkPort {
            address,
            allowed: ports.iter().copied().collect(),
            port,
        });
    }
    if host.is_empty() {
        return Ok(SocketAddr::new(address, port));
    }
    // Accept the bracketed IPv6 form too; never resolve names.
    let literal = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match literal.parse::<IpAddr>() {
        Ok(ip) if ip.to_canonical() == address => Ok(SocketAddr::new(address, port)),
        Ok(asked) => Err(Denial::OtherAddress { address, asked }),
        Err(_) => Err(Denial::NotAnAddress(host.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "10.244.0.5";

    fn scope(address: Option<&str>) -> Scope<'static> {
        Scope {
            address: address.map(|a| a.parse().unwrap()),
            ports: None,
            max_probes: 3,
        }
    }

    fn at(addr: &str) -> Result<SocketAddr, Denial> {
        Ok(addr.parse().unwrap())
    }

    /// Asserts that the first probe of a call to each of `hosts` (port 80)
    /// is refused.
    fn denies(s: &Scope<'_>, hosts: &[&str]) {
        for host in hosts {
            assert!(authorize(s, 1, host, 80).is_err(), "{host}");
        }
    }

    #[test]
    fn empty_host_or_the_same_address_is_allowed() {
        let s = scope(Some(POD));
        assert_eq!(authorize(&s, 1, "", 80), at("10.244.0.5:80"));
        assert_eq!(authorize(&s, 1, POD, 81), at("10.244.0.5:81"));
        // The mapped form names the same address.
        assert_eq!(
            authorize(&s, 1, "::ffff:10.244.0.5", 82),
            at("10.244.0.5:82")
        );
    }

    #[test]
    fn a_host_network_pod_is_reachable_only_on_its_service_ports() {
        let ports = BTreeSet::from([8080, 9001]);
        let s = Scope {
            ports: Some(&ports),
            ..scope(Some(POD))
        };
        assert_eq!(authorize(&s, 1, "", 8080), at("10.244.0.5:8080"));
        let denied = authorize(&s, 1, POD, 10250).unwrap_err().to_string();
        assert!(
            denied.contains("hostNetwork")
                && denied.contains("8080, 9001")
                && denied.contains("10250"),
            "{denied}"
        );
        assert_eq!(authorize(&s, 1, POD, 9001), at("10.244.0.5:9001"));
        // The empty host is the same address: its other ports are closed too.
        assert!(authorize(&s, 1, "", 22).is_err());
    }

    #[test]
    fn ipv6_is_compared_as_an_address_not_a_string() {
        let s = scope(Some("fd00:10:244::5"));
        assert_eq!(
            authorize(&s, 1, "fd00:10:244:0:0:0:0:5", 80),
            at("[fd00:10:244::5]:80")
        );
        assert_eq!(
            authorize(&s, 1, "[fd00:10:244::5]", 80),
            at("[fd00:10:244::5]:80")
        );
    }

    #[test]
    fn other_addresses_names_and_port_zero_are_denied() {
        let s = scope(Some(POD));
        denies(
            &s,
            &[
                "10.244.0.6",
                "169.254.169.254",
                "127.0.0.1",
                "localhost",
                "pod.ns.svc",
                "10.244.0.5:80",
            ],
        );
        assert!(authorize(&s, 1, "", 0).is_err());
    }

    /// Names are refused even when they would resolve to the address under
    /// judgement: resolving them would let DNS decide where a probe goes.
    #[test]
    fn a_name_is_denied_even_for_the_pods_own_address() {
        let s = scope(Some("127.0.0.1"));
        assert_eq!(
            authorize(&s, 1, "localhost", 80),
            Err(Denial::NotAnAddress("localhost".into()))
        );
    }

    /// Near spellings of the address are other addresses, or none: a
    /// looser comparison (by prefix, ignoring the last octet, reading
    /// leading zeros as octal or decimal, dropping a zone) would let a
    /// probe out.
    #[test]
    fn near_spellings_of_the_address_are_denied() {
        denies(
            &scope(Some(POD)),
            &[
                "010.244.0.5",
                "10.244.0.50",
                "10.244.0.05",
                "10.244.0",
                " 10.244.0.5",
                "10.244.0.5 ",
                "::ffff:10.244.0.6",
                "::10.244.0.5",
                "[10.244.0.6]",
                "0.0.0.0",
                "255.255.255.255",
            ],
        );
        denies(&scope(Some("fe80::1")), &["fe80::1%eth0", "fe80::2"]);
    }

    #[test]
    fn no_probes_during_validate_config() {
        let s = scope(None);
        let denied = authorize(&s, 1, "", 80).unwrap_err();
        assert!(denied.to_string().contains("validate-config"));
        // Not even to an address written out.
        assert!(authorize(&s, 1, POD, 80).is_err());
    }

    /// The cap is checked before where the probe goes: a guest past it is
    /// refused even the address under judgement.
    #[test]
    fn the_nth_probe_past_the_cap_is_denied() {
        let s = scope(Some(POD));
        assert!(authorize(&s, 3, "", 80).is_ok());
        assert_eq!(authorize(&s, 4, "", 80), Err(Denial::TooMany(3)));
        assert_eq!(
            authorize(&s, 4, POD, 80).unwrap_err().to_string(),
            "more than 3 probes in one call"
        );
    }

    /// Which refusals count against the cap: all but those refused before any
    /// address is named, so probing other addresses cannot dodge the cap.
    #[test]
    fn denied_probes_count_against_the_cap() {
        let s = scope(Some(POD));
        for host in ["10.244.0.6", "localhost"] {
            assert!(authorize(&s, 1, host, 80).unwrap_err().counts(), "{host}");
        }
        assert!(!authorize(&s, 1, "", 0).unwrap_err().counts());
        assert!(!authorize(&scope(None), 1, "", 80).unwrap_err().counts());
    }
}
