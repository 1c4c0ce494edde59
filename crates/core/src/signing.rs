//! HMAC-SHA256 signatures as cloud-web's webhooks carry them, both ways:
//! the inbound generic webhook checks them, alert webhooks send them.
//! `sha256=<hex>` of the signed bytes (`"<timestamp>.<body>"` for the
//! timestamped form).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Checks `sha256=<hex>` against the HMAC-SHA256 of `body` under `secret`,
/// in constant time.
pub fn signature_valid(secret: &[u8], body: &[u8], header_value: &str) -> bool {
    let Some(hex_signature) = header_value.strip_prefix("sha256=") else {
        return false;
    };
    let Ok(given) = hex::decode(hex_signature) else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

/// The signature header value for `body`, as a sender computes it.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The signed bytes of the timestamped form: `"<timestamp>.<body>"`.
pub fn timestamped(timestamp: i64, body: &[u8]) -> Vec<u8> {
    [timestamp.to_string().as_bytes(), b".", body].concat()
}
