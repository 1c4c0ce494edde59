//! Renewal of the node's client certificate over the mTLS channel.
//!
//! At two thirds of the certificate's life the agent makes a new key and a
//! CSR naming its node id, sends it to `POST /agent/v1/renew` with the
//! current certificate, stores the answer (see
//! [`Identity::replace_certificate`]) and switches the client to it. The
//! control plane revokes the old certificate once the new one is used. A
//! failed try is retried every [`RETRY`] (or sooner, when less than that is
//! left) until the certificate expires; a node whose certificate did expire
//! re-joins with a new token (`cloudweb-agent join`, see [`crate::join`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

use crate::client::{ClientError, ControlPlane};
use crate::identity::{Identity, Validity};

/// Pause between failed renewals (a control plane that is down, or one
/// older than 0.2.0 that has no renewal endpoint).
pub const RETRY: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("cannot make a key or CSR: {0}")]
    Key(#[from] rcgen::Error),
    #[error("the control plane's certificate is not usable: {0}")]
    Answer(String),
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
}

/// How long to wait before the next try: until `renew_at`, or after a
/// failure the smaller of [`RETRY`] and a tenth of what is left before
/// expiry (at least one second).
pub fn next_try(validity: &Validity, now: SystemTime, failed: bool) -> Duration {
    if !failed {
        return validity.renew_at().duration_since(now).unwrap_or_default();
    }
    let left = validity.not_after.duration_since(now).unwrap_or_default();
    RETRY.min(left / 10).max(Duration::from_secs(1))
}

/// One renewal: new key, CSR, answer checked, stored, in use.
pub async fn renew_once(client: &ControlPlane, identity: &mut Identity, data_dir: &std::path::Path) -> Result<Validity, RenewError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, identity.info.node_id.as_str());
    params.distinguished_name = name;
    let csr = params.serialize_request(&key)?.pem()?;
    let answer = client.renew(&csr).await?;
    let validity = Validity::of_pem(&answer.certificate).ok_or_else(|| RenewError::Answer("not a certificate".into()))?;
    let mut renewed = identity.clone();
    renewed.key_pem = key.serialize_pem();
    renewed.cert_pem = answer.certificate.clone();
    // The pair must load as a TLS identity before it replaces the old one.
    ControlPlane::for_node(&renewed, 1).map_err(|e| RenewError::Answer(e.to_string()))?;
    identity.replace_certificate(data_dir, renewed.key_pem, renewed.cert_pem)?;
    client.set_identity(identity)?;
    Ok(validity)
}

/// Renews whenever due, until the task is aborted.
pub async fn renewer(client: Arc<ControlPlane>, mut identity: Identity, data_dir: PathBuf) {
    let mut failed = false;
    loop {
        let Ok(validity) = identity.validity() else {
            tracing::error!("node.crt cannot be read; the certificate will not be renewed");
            return;
        };
        let now = SystemTime::now();
        if validity.expired_at(now) {
            tracing::error!(
                not_after = %validity.not_after_text(),
                "this node's certificate expired; re-join with a new token (`cloudweb-agent join`) to keep its name and instances"
            );
            return;
        }
        tokio::time::sleep(next_try(&validity, now, failed)).await;
        if SystemTime::now() < validity.renew_at() {
            // Woken early (a clock step): look again.
            continue;
        }
        match renew_once(&client, &mut identity, &data_dir).await {
            Ok(renewed) => {
                failed = false;
                tracing::info!(not_after = %renewed.not_after_text(), "renewed this node's certificate");
            }
            Err(err) => {
                failed = true;
                let hint = match &err {
                    RenewError::Client(ClientError::Status { status: 404, .. }) => " (the control plane is older than 0.2.0 and cannot renew; upgrade it before the certificate expires)",
                    _ => "",
                };
                tracing::warn!(error = %err, not_after = %validity.not_after_text(), "could not renew this node's certificate{hint}; trying again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validity(start: u64, life: u64) -> Validity {
        let not_before = SystemTime::UNIX_EPOCH + Duration::from_secs(start);
        Validity { not_before, not_after: not_before + Duration::from_secs(life) }
    }

    /// The schedule as a clock moves through a certificate's life.
    #[test]
    fn renews_at_two_thirds_and_retries_faster_near_the_end() {
        let v = validity(1_000, 365 * 24 * 3600);
        let at = |offset: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + offset);
        assert_eq!(v.renew_at(), at(365 * 24 * 3600 * 2 / 3));
        // Day one: wait until day ~243.
        assert_eq!(next_try(&v, at(0), false), Duration::from_secs(365 * 24 * 3600 * 2 / 3));
        // The clock moves on to the renewal time: due now.
        assert_eq!(next_try(&v, at(365 * 24 * 3600 * 2 / 3), false), Duration::ZERO);
        // Failures far from the end retry every 5 minutes...
        assert_eq!(next_try(&v, at(250 * 24 * 3600), true), RETRY);
        // ...and close to it, every tenth of what is left.
        assert_eq!(next_try(&v, at(365 * 24 * 3600 - 600), true), Duration::from_secs(60));
        assert_eq!(next_try(&v, at(365 * 24 * 3600 - 5), true), Duration::from_secs(1));
        assert!(!v.expired_at(at(365 * 24 * 3600 - 1)));
        assert!(v.expired_at(at(365 * 24 * 3600)));

        // A 90-second certificate (what the tests use) renews after 60 s.
        let short = validity(5_000, 90);
        assert_eq!(short.renew_at(), SystemTime::UNIX_EPOCH + Duration::from_secs(5_060));
    }
}
