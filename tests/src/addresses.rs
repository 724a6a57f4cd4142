//! Unique pod addresses.
//!
//! Tests run in parallel and bind real listeners on pod addresses, so no two
//! pods in one process may share one. A process-wide counter hands them out;
//! it starts at a random point so that namespaces left over from an earlier
//! test binary (deleted in the background) rarely hold the same addresses.
//! The IPv6 address mirrors the IPv4 one (10.244.3.7 ↔ fd00:10:244::3:7).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{
        LazyLock,
        atomic::{AtomicU32, Ordering},
    },
};

/// 10.244.0.0/16 without .0 and .255 in the last octet.
const SPACE: u32 = 256 * 254;

static NEXT: LazyLock<AtomicU32> = LazyLock::new(|| AtomicU32::new(fastrand::u32(0..SPACE)));

/// One pod's addresses in both families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodIps {
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

impl PodIps {
    /// `[v4]`, for single-stack IPv4 pods.
    pub fn v4(&self) -> Vec<IpAddr> {
        vec![self.v4.into()]
    }
    /// `[v6]`, for single-stack IPv6 pods.
    pub fn v6(&self) -> Vec<IpAddr> {
        vec![self.v6.into()]
    }
    /// `[v4, v6]`, for dual-stack pods.
    pub fn dual(&self) -> Vec<IpAddr> {
        vec![self.v4.into(), self.v6.into()]
    }
}

/// A fresh pair of pod addresses, never handed out before in this process.
pub fn next_ips() -> PodIps {
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % SPACE;
    let (hi, lo) = ((n / 254) as u8, (n % 254 + 1) as u8);
    PodIps {
        v4: Ipv4Addr::new(10, 244, hi, lo),
        v6: Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, hi as u16, lo as u16),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_distinct_and_in_range() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..SPACE {
            let ips = next_ips();
            let [a, b, _, d] = ips.v4.octets();
            assert_eq!((a, b), (10, 244));
            assert!(d != 0 && d != 255);
            assert_eq!(ips.v6.segments()[..4], [0xfd00, 0x10, 0x244, 0]);
            assert!(seen.insert(ips.v4), "{} handed out twice", ips.v4);
        }
    }
}
