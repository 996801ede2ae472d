//! Pod IP allocation from a loopback range (default `127.1.0.0/16`).
//!
//! Linux routes all of 127.0.0.0/8 to `lo`, so every pod can bind its own address with no setup.
//!
//! Invariants: an address is handed out (allocated or reserved) at most once until it is
//! released; the network and broadcast addresses of the range are never used; allocation
//! continues after the last address handed out (round robin), so a freed address is reused as
//! late as possible and a stale endpoint of a deleted pod does not reach a new pod immediately.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// An IPv4 CIDR range to allocate pod addresses from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    /// First usable address (network address + 1).
    first: u32,
    /// Last usable address (broadcast address − 1).
    last: u32,
}

impl FromStr for IpRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR (a.b.c.d/n)"))?;
        let addr: Ipv4Addr = addr.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let len: u32 = len.parse().map_err(|e| format!("{s:?}: {e}"))?;
        if !(8..=30).contains(&len) {
            return Err(format!("{s:?}: prefix length must be 8..=30"));
        }
        let mask = u32::MAX << (32 - len);
        let network = u32::from(addr) & mask;
        Ok(IpRange {
            first: network + 1,
            last: (network | !mask) - 1,
        })
    }
}

impl IpRange {
    /// How many addresses the range holds.
    pub fn size(&self) -> u32 {
        self.last - self.first + 1
    }
}

/// The allocator: which addresses of the range are in use.
#[derive(Debug)]
pub struct Ipam {
    range: IpRange,
    in_use: BTreeSet<u32>,
    /// The next address to try.
    cursor: u32,
}

impl Ipam {
    /// An allocator with nothing in use.
    pub fn new(range: IpRange) -> Self {
        Ipam {
            range,
            in_use: BTreeSet::new(),
            cursor: range.first,
        }
    }

    /// Hands out a free address, or `None` when the range is exhausted.
    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        for _ in 0..self.range.size() {
            let candidate = self.cursor;
            self.cursor = if candidate >= self.range.last {
                self.range.first
            } else {
                candidate + 1
            };
            if self.in_use.insert(candidate) {
                return Some(Ipv4Addr::from(candidate));
            }
        }
        None
    }

    /// Takes a specific free address of the range (a pod keeping its IP across a kubelet restart).
    pub fn reserve(&mut self, ip: Ipv4Addr) -> bool {
        let ip = u32::from(ip);
        (self.range.first..=self.range.last).contains(&ip) && self.in_use.insert(ip)
    }

    /// Returns an address to the pool; addresses outside the range or not in use are ignored.
    pub fn release(&mut self, ip: Ipv4Addr) {
        self.in_use.remove(&u32::from(ip));
    }

    /// How many addresses are in use.
    pub fn in_use(&self) -> usize {
        self.in_use.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum Op {
        Alloc(Option<&'static str>),
        Release(&'static str),
        Reserve(&'static str, bool),
    }

    fn check(range: &str, ops: &[Op]) {
        let mut ipam = Ipam::new(range.parse().unwrap());
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Alloc(expected) => {
                    let got = ipam.allocate().map(|ip| ip.to_string());
                    assert_eq!(got.as_deref(), *expected, "step {i}");
                }
                Op::Release(ip) => ipam.release(ip.parse().unwrap()),
                Op::Reserve(ip, ok) => assert_eq!(ipam.reserve(ip.parse().unwrap()), *ok, "step {i}"),
            }
        }
    }

    #[test]
    fn ranges_parse() {
        let r: IpRange = "127.1.0.0/16".parse().unwrap();
        assert_eq!(
            (Ipv4Addr::from(r.first), Ipv4Addr::from(r.last)),
            ("127.1.0.1".parse().unwrap(), "127.1.255.254".parse().unwrap())
        );
        assert_eq!(r.size(), 65534);
        let r: IpRange = "127.1.2.3/30".parse().unwrap();
        assert_eq!(r.size(), 2);
        assert!("127.1.0.0".parse::<IpRange>().is_err());
        assert!("127.1.0.0/31".parse::<IpRange>().is_err());
        assert!("x/16".parse::<IpRange>().is_err());
    }

    #[test]
    fn tiny_pool_round_robin_no_reuse_while_in_use() {
        use Op::*;
        // 127.9.0.0/29 → usable .1 … .6
        check(
            "127.9.0.0/29",
            &[
                Alloc(Some("127.9.0.1")),
                Alloc(Some("127.9.0.2")),
                Release("127.9.0.1"),
                Alloc(Some("127.9.0.3")),
                Alloc(Some("127.9.0.4")),
                Alloc(Some("127.9.0.5")),
                Alloc(Some("127.9.0.6")),
                Alloc(Some("127.9.0.1")),
                Alloc(None),
                Release("127.9.0.4"),
                Release("10.0.0.1"),
                Alloc(Some("127.9.0.4")),
                Alloc(None),
            ],
        );
        check(
            "127.9.0.0/29",
            &[
                Reserve("127.9.0.2", true),
                Reserve("127.9.0.2", false),
                Reserve("127.9.0.7", false),
                Reserve("10.0.0.1", false),
                Alloc(Some("127.9.0.1")),
                Alloc(Some("127.9.0.3")),
            ],
        );
    }

    #[test]
    fn random_sequences_keep_used_plus_free_equal_total() {
        let mut ipam = Ipam::new("127.9.0.0/28".parse().unwrap());
        let mut held: Vec<Ipv4Addr> = Vec::new();
        let mut seed = 0x9e37_79b9_u32;
        for _ in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            if !seed.is_multiple_of(3) {
                match ipam.allocate() {
                    Some(ip) => {
                        assert!(!held.contains(&ip), "{ip} handed out twice");
                        held.push(ip);
                    }
                    None => assert_eq!(held.len(), 14),
                }
            } else if !held.is_empty() {
                let ip = held.swap_remove(seed as usize % held.len());
                ipam.release(ip);
            }
            assert_eq!(ipam.in_use(), held.len());
        }
    }
}
