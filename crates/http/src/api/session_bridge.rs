//! The bridge between a user's WebSocket and a node's dial-back for one
//! session: frames are checked (a user may send only stdin, resize, end
//! of input and ping) and passed on as they come, never a whole line or
//! output held back. It ends when the process exits, either side closes,
//! the node goes silent, or nothing moved for the idle timeout; then the
//! dial-back is dropped (the node ends the process) and the end recorded.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use cloudweb_core::sessions::{self, Ended, Opened};
use cloudweb_protocol::sessions::{SessionFrame, PEER_GONE_SECONDS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::AppState;

/// How often the bridge looks at its timers.
const TICK: Duration = Duration::from_secs(1);
/// How long the last frames and the close may take to reach the user.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What ended the loop.
enum Outcome {
    Continue,
    Done,
}

pub async fn bridge(state: Arc<AppState>, opened: Opened, mut socket: WebSocket) {
    let Opened { row, stream, held } = opened;
    let (mut from_node, mut to_node) = tokio::io::split(stream);
    let idle_limit = state.config.sessions.idle_timeout;
    let peer_gone = Duration::from_secs(PEER_GONE_SECONDS);
    let mut ended = Ended::default();
    let mut pending: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut read = vec![0u8; 64 * 1024];
    let mut last_data = Instant::now();
    let mut last_node = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    let node = row.node_id.clone();
    // The last frame the user gets when the session ends other than by
    // the process's exit or the node's own error.
    let mut farewell: Option<SessionFrame> = None;
    // The node's own last frame (exit status or error), held until the
    // end is recorded.
    let mut last: Option<Vec<u8>> = None;
    loop {
        tokio::select! {
            got = from_node.read(&mut read) => {
                let n = match got {
                    Ok(0) | Err(_) => {
                        let why = format!("node {node} closed the session before the process ended (the node or its agent went away)");
                        farewell = Some(SessionFrame::Error(why.clone()));
                        ended.failure = Some(why);
                        break;
                    }
                    Ok(n) => n,
                };
                last_node = Instant::now();
                pending.extend_from_slice(&read[..n]);
                match to_user(&mut socket, &mut pending, &mut ended, &mut last_data, &mut last).await {
                    Ok(Outcome::Continue) => {}
                    Ok(Outcome::Done) => break,
                    Err(why) => {
                        ended.failure = Some(why);
                        break;
                    }
                }
            }
            message = socket.recv() => {
                match message {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => {
                        ended.note = Some("closed by the user".to_string());
                        break;
                    }
                    Some(Ok(Message::Binary(bytes))) => match SessionFrame::decode_one(&bytes) {
                        Ok(frame) if frame.is_from_user() => {
                            if let SessionFrame::Data(data) = &frame {
                                ended.bytes_in += data.len() as u64;
                                last_data = Instant::now();
                            }
                            if frame == SessionFrame::Ping {
                                continue;
                            }
                            if to_node.write_all(&bytes).await.is_err() {
                                let why = format!("node {node} closed the session before the process ended (the node or its agent went away)");
                                farewell = Some(SessionFrame::Error(why.clone()));
                                ended.failure = Some(why);
                                break;
                            }
                        }
                        Ok(_) => {
                            let why = "the client sent a frame only a node may send".to_string();
                            farewell = Some(SessionFrame::Error(why.clone()));
                            ended.failure = Some(why);
                            break;
                        }
                        Err(err) => {
                            let why = format!("the client sent a bad frame: {err}");
                            farewell = Some(SessionFrame::Error(why.clone()));
                            ended.failure = Some(why);
                            break;
                        }
                    },
                    Some(Ok(Message::Text(_))) => {
                        let why = "the client sent text; a session carries binary frames".to_string();
                        farewell = Some(SessionFrame::Error(why.clone()));
                        ended.failure = Some(why);
                        break;
                    }
                    // WebSocket pings are answered by the library.
                    Some(Ok(_)) => {}
                }
            }
            _ = tick.tick() => {
                if last_data.elapsed() >= idle_limit {
                    let why = format!("closed after {} s without input or output", idle_limit.as_secs());
                    farewell = Some(SessionFrame::Error(why.clone()));
                    ended.failure = Some(why);
                    break;
                }
                if last_node.elapsed() >= peer_gone {
                    let why = format!("node {node} stopped answering (nothing for {} s); the session is lost", peer_gone.as_secs());
                    farewell = Some(SessionFrame::Error(why.clone()));
                    ended.failure = Some(why);
                    break;
                }
            }
        }
    }
    // The node ends the process once its dial-back closes.
    drop(from_node);
    drop(to_node);
    // Recorded before the user is told: once a client sees its session
    // end, the session's record says how it ended.
    sessions::record_end(&state, &row.id, &ended).await;
    let closing = async {
        if let Some(bytes) = last {
            let _ = socket.send(Message::Binary(bytes.into())).await;
        } else if let Some(frame) = farewell {
            let _ = socket.send(Message::Binary(frame.encode().into())).await;
        }
        let _ = socket.send(Message::Close(Some(CloseFrame { code: 1000, reason: "session ended".into() }))).await;
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, closing).await;
    drop(held);
}

/// Sends the whole frames in `pending` to the user, as they are, except
/// the last one (the process's exit or the node's error): that goes into
/// `last`, for the caller to send once the session's end is recorded, and
/// the answer is `Done`.
async fn to_user(socket: &mut WebSocket, pending: &mut Vec<u8>, ended: &mut Ended, last_data: &mut Instant, last: &mut Option<Vec<u8>>) -> Result<Outcome, String> {
    let mut at = 0;
    let mut outcome = Outcome::Continue;
    while let Some((frame, used)) = SessionFrame::decode(&pending[at..]).map_err(|e| format!("the node sent a bad frame: {e}"))? {
        let bytes = pending[at..at + used].to_vec();
        at += used;
        match frame {
            SessionFrame::Ping | SessionFrame::Resize { .. } | SessionFrame::Eof => continue,
            SessionFrame::Data(data) | SessionFrame::Stderr(data) => {
                ended.bytes_out += data.len() as u64;
                *last_data = Instant::now();
            }
            SessionFrame::Exit(code) => {
                ended.exit_code = Some(code);
                *last = Some(bytes);
                outcome = Outcome::Done;
                break;
            }
            SessionFrame::Error(message) => {
                ended.failure = Some(message);
                *last = Some(bytes);
                outcome = Outcome::Done;
                break;
            }
        }
        if socket.send(Message::Binary(bytes.into())).await.is_err() {
            pending.drain(..at);
            ended.note = Some("the user's connection dropped".to_string());
            return Ok(Outcome::Done);
        }
    }
    pending.drain(..at);
    Ok(outcome)
}
