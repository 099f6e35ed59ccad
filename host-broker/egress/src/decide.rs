//! The decision on one connection: the policy's mode and rules, on the name
//! the guest asked for and on every address the broker resolved for it.
//!
//! Two steps, both pure: [`check_name`] before resolving (mode `off`, deny
//! rules on the name, the allow list's name rules), [`check_addresses`]
//! after (the broker's own API sockets, deny CIDRs, the denied ranges and
//! the host's own addresses unless a CIDR rule inside them allows them,
//! the allow list's CIDRs), each on every form of the address: as resolved,
//! in its own family, and as each IPv4 address it embeds
//! ([`crate::ranges::forms`]). The dialler dials only addresses this module
//! passed; a live connection is judged again by [`recheck`] when the policy
//! changes. Every refusal is one line naming the rule.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use dormouse_protocol::egress_policy::{
    Destination, EgressMode, EgressPolicy, EgressRule, RuleTarget,
};

use crate::ranges::{canonical, denied_forms, forms};

/// A refusal: the line the guest sees, and the rule that decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// One line, e.g. `denied: pypi.org:443 not in the allow list`.
    pub reason: String,
    /// The rule that decided, canonical, when one did.
    pub rule: Option<String>,
    /// The address refused, when an address was.
    pub address: Option<SocketAddr>,
}

impl Refusal {
    fn new(reason: String, rule: Option<&EgressRule>) -> Self {
        Self {
            reason,
            rule: rule.map(ToString::to_string),
            address: None,
        }
    }
}

/// What the host looks like to the decision: its own addresses and the
/// broker's own API sockets (never reachable, whatever a rule says).
#[derive(Debug, Clone, Default)]
pub struct HostView {
    /// Addresses of this host's interfaces (canonical forms).
    pub own: HashSet<IpAddr>,
    /// The broker's API sockets; an unspecified address stands for every
    /// address of the host and loopback.
    pub protected: Vec<SocketAddr>,
}

impl HostView {
    fn is_protected(&self, a: IpAddr, port: u16) -> bool {
        self.protected.iter().any(|p| {
            p.port() == port
                && (canonical(p.ip()) == canonical(a)
                    || (p.ip().is_unspecified()
                        && (a.is_loopback() || self.own.contains(&canonical(a)))))
        })
    }
}

/// What the name step passed on to the address step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePass {
    /// The allow rule that named the host, in `allowlist` mode.
    pub rule: Option<EgressRule>,
}

/// An address that may be dialled, with the rule that allowed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The address (as resolved).
    pub addr: IpAddr,
    /// The rule that allowed it, canonical, when one did (`open` needs none).
    pub rule: Option<String>,
}

fn target(dest: &Destination, port: u16) -> String {
    format!("{dest}:{port}")
}

/// The first step: everything decided on the name alone.
pub fn check_name(
    policy: &EgressPolicy,
    dest: &Destination,
    port: u16,
) -> Result<NamePass, Refusal> {
    if policy.mode == EgressMode::Off {
        return Err(Refusal::new(
            "denied: egress is off for this desktop".into(),
            None,
        ));
    }
    if port == 0 {
        return Err(Refusal::new(format!("denied: port 0 of {dest}"), None));
    }
    let Destination::Name(name) = dest else {
        return Ok(NamePass { rule: None });
    };
    if let Some(rule) = policy.deny.iter().find(|r| r.matches_host(name, port)) {
        return Err(Refusal::new(
            format!("denied: {} matches deny rule {rule}", target(dest, port)),
            Some(rule),
        ));
    }
    let rule = match policy.mode {
        EgressMode::Allowlist => policy
            .allow
            .iter()
            .find(|r| r.matches_host(name, port))
            .cloned(),
        EgressMode::Open | EgressMode::Off => None,
    };
    // A name no rule can allow is refused before it is resolved, so a
    // refused name never reaches a resolver.
    let any_cidr = policy
        .allow
        .iter()
        .any(|r| matches!(r.target, RuleTarget::Cidr(_)));
    if policy.mode == EgressMode::Allowlist && rule.is_none() && !any_cidr {
        return Err(Refusal::new(
            format!("denied: {} not in the allow list", target(dest, port)),
            None,
        ));
    }
    Ok(NamePass { rule })
}

/// Why one address was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AddrRefusal {
    Protected,
    DenyRule(EgressRule),
    Range(&'static str),
    HostOwn,
    NotAllowed,
}

impl AddrRefusal {
    fn describe(&self, a: IpAddr) -> String {
        match self {
            Self::Protected => format!("{a} is the broker's own API"),
            Self::DenyRule(r) => format!("{a} matches deny rule {r}"),
            Self::Range(what) => format!("{a} is {what}"),
            Self::HostOwn => format!("{a} is an address of this host"),
            Self::NotAllowed => format!("{a} is not in the allow list"),
        }
    }
}

/// An allow CIDR rule naming `a` on `port` that lies wholly inside `inside`
/// (when given): what lifts a denied range.
fn cidr_allow<'p>(
    policy: &'p EgressPolicy,
    a: IpAddr,
    port: u16,
    inside: Option<&dormouse_protocol::egress_policy::Cidr>,
) -> Option<&'p EgressRule> {
    policy.allow.iter().find(|r| {
        r.matches_addr(a, port)
            && match (&r.target, inside) {
                (RuleTarget::Cidr(c), Some(outer)) => c.within(outer),
                (RuleTarget::Cidr(_), None) => true,
                (RuleTarget::Host(_), _) => false,
            }
    })
}

/// One address, judged in each of its forms ([`forms`]): the deny rules,
/// the denied ranges, the host's own addresses and the allow rules each see
/// the address as resolved, in its own family, and every IPv4 address it
/// embeds. A denied range one form lies in is lifted only by an allow CIDR
/// inside that range naming that form, and every such range must be.
fn check_addr(
    policy: &EgressPolicy,
    name: &NamePass,
    resolved: IpAddr,
    port: u16,
    host: &HostView,
) -> Result<Option<String>, AddrRefusal> {
    let forms = forms(resolved);
    if forms.iter().any(|&a| host.is_protected(a, port)) {
        return Err(AddrRefusal::Protected);
    }
    if let Some(rule) = policy
        .deny
        .iter()
        .find(|r| forms.iter().any(|&a| r.matches_addr(a, port)))
    {
        return Err(AddrRefusal::DenyRule(rule.clone()));
    }
    let denied = denied_forms(resolved);
    if !denied.is_empty() {
        let mut lifted = None;
        for (a, range) in denied {
            match cidr_allow(policy, a, port, Some(&range.cidr)) {
                Some(rule) => {
                    lifted.get_or_insert_with(|| rule.to_string());
                }
                None => return Err(AddrRefusal::Range(range.what)),
            }
        }
        return Ok(lifted);
    }
    let own: Vec<IpAddr> = forms
        .iter()
        .map(|&a| canonical(a))
        .filter(|a| host.own.contains(a))
        .collect();
    if !own.is_empty() {
        let single = |a: IpAddr| {
            policy.allow.iter().find(|r| {
                r.matches_addr(a, port) && matches!(&r.target, RuleTarget::Cidr(c) if c.is_single())
            })
        };
        let mut rule = None;
        for a in own {
            let named = single(a).ok_or(AddrRefusal::HostOwn)?;
            rule.get_or_insert_with(|| named.to_string());
        }
        return Ok(rule);
    }
    let allowed = forms
        .iter()
        .find_map(|&a| cidr_allow(policy, a, port, None))
        .map(ToString::to_string);
    match policy.mode {
        EgressMode::Open => Ok(allowed),
        EgressMode::Allowlist => match allowed {
            Some(rule) => Ok(Some(rule)),
            None => match &name.rule {
                Some(rule) => Ok(Some(rule.to_string())),
                None => Err(AddrRefusal::NotAllowed),
            },
        },
        EgressMode::Off => Err(AddrRefusal::NotAllowed),
    }
}

/// The second step: which resolved addresses may be dialled, in order; a
/// refusal when none may.
pub fn check_addresses(
    policy: &EgressPolicy,
    dest: &Destination,
    port: u16,
    name: &NamePass,
    resolved: &[IpAddr],
    host: &HostView,
) -> Result<Vec<Pass>, Refusal> {
    let mut passed = Vec::new();
    let mut first: Option<(IpAddr, AddrRefusal)> = None;
    for &addr in resolved {
        match check_addr(policy, name, addr, port, host) {
            Ok(rule) => passed.push(Pass { addr, rule }),
            Err(why) => {
                let better = match &first {
                    None => true,
                    Some((_, AddrRefusal::NotAllowed)) => why != AddrRefusal::NotAllowed,
                    Some(_) => false,
                };
                if better {
                    first = Some((addr, why));
                }
            }
        }
    }
    if !passed.is_empty() {
        return Ok(passed);
    }
    let t = target(dest, port);
    let Some((addr, why)) = first else {
        return Err(Refusal::new(
            format!("failed: {t} resolves to no address"),
            None,
        ));
    };
    let name_rule = name.rule.as_ref();
    let mut refusal = match (&why, dest) {
        (AddrRefusal::NotAllowed, _) => {
            Refusal::new(format!("denied: {t} not in the allow list"), None)
        }
        (AddrRefusal::DenyRule(rule), Destination::Addr(_)) => {
            Refusal::new(format!("denied: {t} matches deny rule {rule}"), Some(rule))
        }
        (AddrRefusal::DenyRule(rule), Destination::Name(_)) => Refusal::new(
            format!(
                "denied: {t} resolves only to denied addresses ({})",
                why.describe(addr)
            ),
            Some(rule),
        ),
        (_, Destination::Addr(_)) => {
            Refusal::new(format!("denied: {t}: {}", why.describe(addr)), name_rule)
        }
        (_, Destination::Name(_)) => Refusal::new(
            format!(
                "denied: {t} resolves only to denied addresses ({})",
                why.describe(addr)
            ),
            name_rule,
        ),
    };
    refusal.address = Some(SocketAddr::new(addr, port));
    Err(refusal)
}

/// A live connection judged again under a new policy: the same two steps
/// on the name it asked for and the one address it reached.
pub fn recheck(
    policy: &EgressPolicy,
    dest: &Destination,
    addr: IpAddr,
    port: u16,
    host: &HostView,
) -> Result<(), Refusal> {
    let name = check_name(policy, dest, port)?;
    check_addresses(policy, dest, port, &name, &[addr], host).map(|_| ())
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
