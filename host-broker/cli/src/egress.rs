//! `dormouse egress`: a desktop's egress policy and audit. Without an
//! action it prints the policy; `allow RULE...` and `deny RULE...` add
//! rules (allow also switches `off` to `allowlist`), `off` and `open` set
//! the mode, `log` prints the audit.

use std::io::Write;

use dormouse_client::Client;
use dormouse_protocol::egress_policy::{EgressMode, EgressPolicy, EgressRule};

use crate::escape::Safe;
use crate::output::print_json;
use crate::{resolve, stdout, CliError};

/// What `dormouse egress ID ...` does.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum EgressAction {
    /// Add allow rules (host patterns or CIDRs) and use the allow list.
    Allow {
        /// Rules, e.g. `pypi.org:443`, `*.example.com`, `203.0.113.0/24`.
        #[arg(required = true, value_name = "RULE")]
        rules: Vec<String>,
    },
    /// Add deny rules (they win over allow rules in every mode).
    Deny {
        /// Rules, e.g. `ads.example.com`, `10.0.0.0/8`.
        #[arg(required = true, value_name = "RULE")]
        rules: Vec<String>,
    },
    /// Refuse every connection.
    Off,
    /// Allow every public address, less the deny rules.
    Open,
    /// Print the audit, oldest first.
    Log {
        /// Only entries after this sequence number.
        #[arg(long, value_name = "SEQ")]
        since: Option<u64>,
    },
}

fn parse_rules(rules: &[String]) -> Result<Vec<EgressRule>, CliError> {
    rules
        .iter()
        .map(|r| {
            r.parse()
                .map_err(|e: dormouse_protocol::egress_policy::RuleError| {
                    CliError::Usage(e.to_string())
                })
        })
        .collect()
}

/// Runs `dormouse egress ID [ACTION]`.
pub(crate) async fn run(
    client: &Client,
    id: &str,
    action: Option<EgressAction>,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    let mut policy = client.egress(id).await?;
    let changed = match action {
        None => None,
        Some(EgressAction::Log { since }) => {
            let page = client.egress_log(id, since).await?;
            if json {
                return print_json(out, &page);
            }
            for e in &page.entries {
                writeln!(
                    out,
                    "{} {} {}:{} {} {} {}",
                    e.seq,
                    e.time.format("%Y-%m-%dT%H:%M:%SZ"),
                    Safe(&e.host),
                    e.port,
                    e.decision.as_str(),
                    Safe(e.rule.as_deref().unwrap_or("-")),
                    Safe(e.reason.as_deref().unwrap_or("")),
                )
                .map_err(stdout)?;
            }
            return Ok(());
        }
        Some(EgressAction::Allow { rules }) => {
            let rules = parse_rules(&rules)?;
            if policy.mode == EgressMode::Off {
                policy.mode = EgressMode::Allowlist;
            }
            add(&mut policy.allow, rules);
            Some(policy)
        }
        Some(EgressAction::Deny { rules }) => {
            add(&mut policy.deny, parse_rules(&rules)?);
            Some(policy)
        }
        Some(EgressAction::Off) => Some(EgressPolicy {
            mode: EgressMode::Off,
            ..policy
        }),
        Some(EgressAction::Open) => Some(EgressPolicy {
            mode: EgressMode::Open,
            ..policy
        }),
    };
    let policy = match changed {
        Some(p) => client.set_egress(id, &p).await?,
        None => client.egress(id).await?,
    };
    if json {
        return print_json(out, &policy);
    }
    writeln!(out, "mode: {}", policy.mode).map_err(stdout)?;
    for (name, list) in [("allow", &policy.allow), ("deny", &policy.deny)] {
        for r in list {
            writeln!(out, "{name} {r}").map_err(stdout)?;
        }
    }
    Ok(())
}

fn add(list: &mut Vec<EgressRule>, rules: Vec<EgressRule>) {
    for r in rules {
        if !list.contains(&r) {
            list.push(r);
        }
    }
}
