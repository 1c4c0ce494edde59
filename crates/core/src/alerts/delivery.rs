//! Getting alert messages to channels (leader only).
//!
//! - Fan-out: an alert's opening, and later its resolution, is queued once
//!   to every channel that wants its kind, in the transaction that marks
//!   it queued (`cloudweb_store::alert_delivery`), so one outage is one
//!   "opened" and one "resolved" message per channel. A `deploy_succeeded`
//!   notice is only ever "opened".
//! - Delivery: due messages are sent, each channel one at a time and the
//!   channels side by side (a channel whose server hangs holds up only
//!   itself, for at most [`send::SEND_TIMEOUT`]). A failed attempt is
//!   tried again after 10 s, doubling to at most an hour, until 24 hours
//!   after the message was queued; then it is `failed`. Every attempt is
//!   kept with its answer or error.
//! - Rate: each channel sends at most [`BURST`] messages at once, then one
//!   every [`REFILL`]; messages over that wait in the queue (not counted
//!   as attempts), so a storm of alerts cannot flood a mailbox.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_api_types::alerts::{AlertMessage, AlertView, ChannelTarget};
use cloudweb_store::alert_delivery::{AfterAttempt, AttemptRow, ChannelRow, DeliveryRow};

use super::send;
use crate::error::ApiError;
use crate::AppState;

/// A message is tried for this long after it was queued.
pub const GIVE_UP_AFTER_MS: i64 = 24 * 3600 * 1000;
/// The first retry's delay; each next one doubles, up to [`MAX_RETRY_DELAY_MS`].
const FIRST_RETRY_DELAY_MS: i64 = 10_000;
const MAX_RETRY_DELAY_MS: i64 = 3600 * 1000;
/// Messages a channel may send at once.
pub const BURST: u32 = 20;
/// Then one per this long.
pub const REFILL: Duration = Duration::from_secs(10);
/// Messages sent at the same time, all channels together.
const IN_FLIGHT: usize = 16;
/// Finished deliveries are kept this long.
const KEEP_FINISHED_MS: i64 = 30 * 24 * 3600 * 1000;

/// Sealing context of a channel's configuration.
pub(crate) fn seal_context(channel_id: &str) -> String {
    format!("alert-channel/{channel_id}")
}

fn new_id() -> String {
    let bytes: [u8; 8] = rand::random();
    format!("dlv_{}", hex::encode(bytes))
}

/// A new pending delivery of `message` to a channel.
pub fn queued(channel_id: &str, alert_id: Option<&str>, message: &AlertMessage, now: i64) -> DeliveryRow {
    DeliveryRow {
        id: new_id(),
        channel_id: channel_id.to_string(),
        alert_id: alert_id.map(str::to_string),
        event: message.event.clone(),
        payload: serde_json::to_string(message).expect("a message serializes"),
        state: "pending".into(),
        attempts: 0,
        next_attempt_at: now,
        give_up_at: now + GIVE_UP_AFTER_MS,
        last_error: None,
        created_at: now,
        finished_at: None,
    }
}

/// When attempt `attempt` (from 1) failed at `now`, the next one's time, or
/// `GiveUp` past the delivery's deadline.
pub fn after_failure(attempt: i64, now: i64, give_up_at: i64) -> AfterAttempt {
    let shift = u32::try_from(attempt.saturating_sub(1).clamp(0, 20)).unwrap_or(20);
    let delay = FIRST_RETRY_DELAY_MS.saturating_mul(1 << shift).min(MAX_RETRY_DELAY_MS);
    let next = now + delay;
    if next > give_up_at {
        AfterAttempt::GiveUp
    } else {
        AfterAttempt::RetryAt(next)
    }
}

fn wants(channel: &ChannelRow, kind: &str) -> bool {
    serde_json::from_str::<Vec<String>>(&channel.events).is_ok_and(|events| events.iter().any(|e| e == kind))
}

/// Queues every alert change not queued yet.
pub async fn fan_out(state: &AppState) -> Result<(), ApiError> {
    let unsent = state.store.unsent_alerts(200).await?;
    if unsent.is_empty() {
        return Ok(());
    }
    let channels = state.store.alert_channels().await?;
    for (alert, opened_sent) in unsent {
        let view = super::view(alert.clone());
        let now = state.clock.now_ms();
        let targets: Vec<&ChannelRow> = channels.iter().filter(|c| wants(c, &alert.kind)).collect();
        if !opened_sent {
            let message = AlertMessage { event: "opened".into(), alert: AlertView { resolved_at: None, ..view.clone() } };
            let rows: Vec<DeliveryRow> = targets.iter().map(|c| queued(&c.id, Some(&alert.id), &message, now)).collect();
            state.store.fan_out_alert(&alert.id, "opened", &rows).await?;
        }
        if alert.resolved_at.is_some() {
            // A notice has nothing to resolve; a problem's resolution goes
            // after its opening (a later `created_at`).
            let rows: Vec<DeliveryRow> = if alert.severity == "info" {
                Vec::new()
            } else {
                let message = AlertMessage { event: "resolved".into(), alert: view };
                targets.iter().map(|c| queued(&c.id, Some(&alert.id), &message, now + 1)).collect()
            };
            state.store.fan_out_alert(&alert.id, "resolved", &rows).await?;
        }
    }
    Ok(())
}

/// A channel's send allowance.
struct Bucket {
    tokens: f64,
    at: tokio::time::Instant,
}

impl Bucket {
    /// Takes a token, or says how long until one is there.
    fn take(&mut self, now: tokio::time::Instant) -> Result<(), Duration> {
        let refilled = now.saturating_duration_since(self.at).as_secs_f64() / REFILL.as_secs_f64();
        self.tokens = (self.tokens + refilled).min(f64::from(BURST));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(REFILL.mul_f64(1.0 - self.tokens))
        }
    }
}

/// Sends due messages until the task is aborted (the leader's); aborting
/// it aborts the sends in flight.
pub async fn deliverer(state: Arc<AppState>) {
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut buckets: HashMap<String, Bucket> = HashMap::new();
    let mut sends = tokio::task::JoinSet::new();
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_prune = None::<tokio::time::Instant>;
    loop {
        every.tick().await;
        while sends.try_join_next().is_some() {}
        if let Err(err) = round(&state, &busy, &mut buckets, &mut sends).await {
            tracing::warn!(error = %err, "alert delivery: a round failed; trying again in a second");
        }
        let now = tokio::time::Instant::now();
        if last_prune.is_none_or(|at| now.duration_since(at) > Duration::from_secs(3600)) {
            last_prune = Some(now);
            if let Err(err) = state.store.prune_alert_deliveries(state.clock.now_ms() - KEEP_FINISHED_MS).await {
                tracing::warn!(error = %err, "alert delivery: cannot prune old deliveries");
            }
        }
    }
}

async fn round(
    state: &Arc<AppState>,
    busy: &Arc<Mutex<HashSet<String>>>,
    buckets: &mut HashMap<String, Bucket>,
    sends: &mut tokio::task::JoinSet<()>,
) -> Result<(), ApiError> {
    fan_out(state).await?;
    let due = state.store.due_alert_deliveries(state.clock.now_ms(), 100).await?;
    for delivery in due {
        if sends.len() >= IN_FLIGHT {
            break;
        }
        if !busy.lock().expect("busy channels").insert(delivery.channel_id.clone()) {
            continue;
        }
        let now = tokio::time::Instant::now();
        let bucket = buckets.entry(delivery.channel_id.clone()).or_insert(Bucket { tokens: f64::from(BURST), at: now });
        if let Err(wait) = bucket.take(now) {
            busy.lock().expect("busy channels").remove(&delivery.channel_id);
            let at = state.clock.now_ms() + i64::try_from(wait.as_millis()).unwrap_or(i64::MAX / 2);
            state.store.postpone_alert_delivery(&delivery.id, at).await?;
            continue;
        }
        let (state, busy) = (state.clone(), busy.clone());
        sends.spawn(async move {
            let channel = delivery.channel_id.clone();
            if let Err(err) = attempt(&state, delivery).await {
                tracing::warn!(error = %err, channel, "alert delivery: cannot record an attempt");
            }
            busy.lock().expect("busy channels").remove(&channel);
        });
    }
    Ok(())
}

/// Sends one delivery once and records how it went.
pub async fn attempt(state: &AppState, delivery: DeliveryRow) -> Result<(), ApiError> {
    let Some(channel) = state.store.alert_channel(&delivery.channel_id).await? else {
        return Ok(());
    };
    let started = tokio::time::Instant::now();
    let sent = match (
        state.sealer.open_json::<ChannelTarget>(&seal_context(&channel.id), &channel.config_sealed),
        serde_json::from_str::<AlertMessage>(&delivery.payload),
    ) {
        (Ok(target), Ok(message)) => {
            send::send(&target, &delivery.id, &delivery.payload, &message, state.config.allow_private_alert_targets, state.clock.now_ms() / 1000).await
        }
        (Err(_), _) => Err("the channel's configuration cannot be opened with this cluster's key".to_string()),
        (_, Err(e)) => Err(format!("the queued message does not parse: {e}")),
    };
    let now = state.clock.now_ms();
    let number = delivery.attempts + 1;
    let (ok, outcome) = match sent {
        Ok(answer) => (true, answer),
        Err(error) => (false, error),
    };
    let after = if ok { AfterAttempt::Delivered } else { after_failure(number, now, delivery.give_up_at) };
    match after {
        AfterAttempt::Delivered => tracing::info!(delivery = %delivery.id, channel = %channel.name, %outcome, "alert delivered"),
        AfterAttempt::RetryAt(_) => tracing::warn!(delivery = %delivery.id, channel = %channel.name, attempt = number, %outcome, "alert delivery failed; will retry"),
        AfterAttempt::GiveUp => tracing::warn!(delivery = %delivery.id, channel = %channel.name, attempt = number, %outcome, "alert delivery failed for 24 hours; given up"),
    }
    let duration_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let row = AttemptRow { delivery_id: delivery.id.clone(), attempt: number, at: now, duration_ms, ok, outcome };
    state.store.record_alert_attempt(&row, after).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_an_hour_and_stop_after_a_day() {
        assert_eq!(after_failure(1, 0, GIVE_UP_AFTER_MS), AfterAttempt::RetryAt(10_000));
        assert_eq!(after_failure(2, 0, GIVE_UP_AFTER_MS), AfterAttempt::RetryAt(20_000));
        assert_eq!(after_failure(12, 0, GIVE_UP_AFTER_MS), AfterAttempt::RetryAt(3_600_000));
        assert_eq!(after_failure(1_000, 0, GIVE_UP_AFTER_MS), AfterAttempt::RetryAt(3_600_000));
        assert_eq!(after_failure(3, GIVE_UP_AFTER_MS - 10_000, GIVE_UP_AFTER_MS), AfterAttempt::GiveUp);
    }

    #[tokio::test(start_paused = true)]
    async fn a_channel_sends_a_burst_then_one_per_refill() {
        let start = tokio::time::Instant::now();
        let mut bucket = Bucket { tokens: f64::from(BURST), at: start };
        for _ in 0..BURST {
            assert!(bucket.take(start).is_ok());
        }
        let wait = bucket.take(start).unwrap_err();
        assert_eq!(wait, REFILL);
        assert!(bucket.take(start + REFILL).is_ok());
        assert!(bucket.take(start + REFILL).is_err());
    }
}
