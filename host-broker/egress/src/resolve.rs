//! Names to addresses, on the host: the operator's hosts file first
//! (`dormoused --egress-hosts FILE`, /etc/hosts syntax, for split-horizon
//! names), then the host's resolver; and the host's own addresses, which
//! the decision refuses unless a rule names them.
//!
//! The broker resolves every name itself and dials only what it resolved
//! and checked, so the guest never picks an address behind a name.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use dormouse_protocol::egress_policy::{validate_host_name, Destination};

use crate::ranges::canonical;

/// How long a name may take to resolve.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most addresses kept of one name.
pub const MAX_ADDRESSES: usize = 16;
/// Largest hosts file read.
const MAX_HOSTS_FILE: u64 = 4 << 20;

/// A hosts file or a name that cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The hosts file cannot be read.
    #[error("cannot read the egress hosts file: {0}")]
    Read(#[from] std::io::Error),
    /// A line of the hosts file is malformed.
    #[error("egress hosts file line {line}: {why}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// The hosts file is larger than read.
    #[error("the egress hosts file is larger than 4 MiB")]
    TooLarge,
}

/// Names the operator maps to addresses, consulted before the resolver.
#[derive(Debug, Clone, Default)]
pub struct HostsFile {
    names: HashMap<String, Vec<IpAddr>>,
}

impl HostsFile {
    /// Reads `path` (see [`HostsFile::parse`]).
    pub fn load(path: &Path) -> Result<Self, ResolveError> {
        let meta = std::fs::metadata(path)?;
        if meta.len() > MAX_HOSTS_FILE {
            return Err(ResolveError::TooLarge);
        }
        Self::parse(&std::fs::read_to_string(path)?)
    }

    /// Parses /etc/hosts syntax: `ADDRESS NAME [ALIAS...]` per line, `#`
    /// starts a comment; a name on several lines gets every address.
    pub fn parse(text: &str) -> Result<Self, ResolveError> {
        let mut names: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let Some(addr) = words.next() else { continue };
            let bad = |why: String| ResolveError::Line { line: n + 1, why };
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| bad(format!("`{}` is not an address", addr.escape_default())))?;
            let mut any = false;
            for name in words {
                let name = validate_host_name(name)
                    .map_err(|why| bad(format!("`{}`: {why}", name.escape_default())))?;
                let list = names.entry(name).or_default();
                if !list.contains(&addr) && list.len() < MAX_ADDRESSES {
                    list.push(addr);
                }
                any = true;
            }
            if !any {
                return Err(bad("an address without a name".into()));
            }
        }
        Ok(Self { names })
    }

    /// The addresses mapped to `name`, if it is mapped.
    pub fn get(&self, name: &str) -> Option<&[IpAddr]> {
        self.names.get(name).map(Vec::as_slice)
    }

    /// How many names are mapped.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no name is mapped.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// Resolves destinations: literals as they are, names through the hosts
/// file, then the host's resolver.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    hosts: HostsFile,
}

impl Resolver {
    /// A resolver consulting `hosts` first.
    pub fn new(hosts: HostsFile) -> Self {
        Self { hosts }
    }

    /// Every address of `dest` (at most [`MAX_ADDRESSES`], deduplicated),
    /// or the one-line cause it has none.
    pub async fn resolve(&self, dest: &Destination, port: u16) -> Result<Vec<IpAddr>, String> {
        let name = match dest {
            Destination::Addr(a) => return Ok(vec![*a]),
            Destination::Name(name) => name,
        };
        if let Some(mapped) = self.hosts.get(name) {
            return Ok(mapped.to_vec());
        }
        let lookup = tokio::net::lookup_host((name.as_str(), port));
        match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
            Err(_) => Err(format!(
                "failed: {name} did not resolve in {RESOLVE_TIMEOUT:?}"
            )),
            Ok(Err(e)) => Err(format!("failed: cannot resolve {name}: {e}")),
            Ok(Ok(addrs)) => {
                let mut out: Vec<IpAddr> = Vec::new();
                for a in addrs {
                    if !out.contains(&a.ip()) && out.len() < MAX_ADDRESSES {
                        out.push(a.ip());
                    }
                }
                if out.is_empty() {
                    Err(format!("failed: {name} has no address"))
                } else {
                    Ok(out)
                }
            }
        }
    }
}

/// The addresses of this host's interfaces (canonical forms); empty if
/// they cannot be listed (the denied ranges still hold then).
pub fn host_addresses() -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    match nix::ifaddrs::getifaddrs() {
        Ok(list) => {
            for ifa in list {
                let Some(addr) = ifa.address else { continue };
                if let Some(v4) = addr.as_sockaddr_in() {
                    out.insert(IpAddr::V4(v4.ip()));
                } else if let Some(v6) = addr.as_sockaddr_in6() {
                    out.insert(canonical(IpAddr::V6(v6.ip())));
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot list the host's addresses"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_files_parse_like_etc_hosts() {
        let h = HostsFile::parse(
            "# test sites\n127.0.0.1 site.test  www.site.test # both\n\n::1 site.test\n10.0.0.5\tdb.corp\n",
        )
        .expect("parse");
        assert_eq!(
            h.get("site.test").expect("site"),
            &[
                "127.0.0.1".parse::<IpAddr>().expect("ip"),
                "::1".parse().expect("ip")
            ]
        );
        assert_eq!(h.get("www.site.test").map(<[IpAddr]>::len), Some(1));
        assert_eq!(h.get("db.corp").map(<[IpAddr]>::len), Some(1));
        assert_eq!(h.get("other.test"), None);
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn bad_hosts_lines_name_their_line() {
        for (text, line) in [
            ("127.0.0.1 ok.test\nnot-an-ip name\n", 2),
            ("127.0.0.1\n", 1),
            ("127.0.0.1 ok\n127.0.0.1 bad_name-.x\n", 2),
        ] {
            match HostsFile::parse(text) {
                Err(ResolveError::Line { line: l, .. }) => assert_eq!(l, line, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn the_hosts_file_wins_and_literals_pass_through() {
        let r = Resolver::new(HostsFile::parse("192.0.2.1 localhost\n").expect("hosts"));
        let d = Destination::parse("localhost").expect("dest");
        assert_eq!(
            r.resolve(&d, 80).await.expect("mapped"),
            vec!["192.0.2.1".parse::<IpAddr>().expect("ip")]
        );
        let d = Destination::parse("[::1]").expect("dest");
        assert_eq!(
            r.resolve(&d, 80).await.expect("literal"),
            vec!["::1".parse::<IpAddr>().expect("ip")]
        );
    }

    #[test]
    fn the_host_has_a_loopback_address() {
        assert!(host_addresses().contains(&"127.0.0.1".parse::<IpAddr>().expect("ip")));
    }
}
