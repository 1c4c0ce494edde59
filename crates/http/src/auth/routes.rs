//! The account routes: `POST /api/session` (log in), `DELETE
//! /api/session` (log out), `GET /api/me`, and `GET/POST /api/tokens`,
//! `DELETE /api/tokens/{id}` (personal API tokens), `GET/POST /api/users`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
pub use cloudweb_api_types::accounts::{CreatedTokenView, LoginRequest, MeView, NewTokenRequest, NewUserRequest, SessionView, TokenView, UserView};
use cloudweb_api_types::ErrorBody;

use super::{guard, sessions, tokens, users, Principal, Via};
use crate::clock::rfc3339_ms;
use crate::error::{parse_json, ApiError};
use crate::store::{ApiTokenRow, UserRow};
use crate::AppState;

/// A user as the API shows it.
pub fn user_view(user: &UserRow) -> UserView {
    UserView {
        id: user.id.clone(),
        name: user.name.clone(),
        created_at: rfc3339_ms(user.created_at),
        disabled_at: user.disabled_at.map(rfc3339_ms),
        cluster_role: user.cluster_role.clone(),
    }
}

/// A personal API token as the API shows it (never the secret).
pub fn token_view(row: &ApiTokenRow) -> TokenView {
    TokenView {
        id: row.id.clone(),
        name: row.name.clone(),
        prefix: row.prefix.clone(),
        created_at: rfc3339_ms(row.created_at),
        last_used_at: row.last_used_at.map(rfc3339_ms),
        revoked_at: row.revoked_at.map(rfc3339_ms),
        role: row.role.clone(),
        apps: row.apps.clone(),
        expires_at: row.expires_at.map(rfc3339_ms),
    }
}

/// Log in with a name and password. JSON answers 200 with the CSRF token;
/// a form (`application/x-www-form-urlencoded`) is answered with a 303 to
/// its `next` path. Both set the `cloudweb_session` (HttpOnly) and
/// `cloudweb_csrf` cookies.
#[utoipa::path(post, path = "/api/session", operation_id = "auth_login", tag = "accounts", security(()),
    request_body(content(
        (LoginRequest = "application/json"),
        (LoginRequest = "application/x-www-form-urlencoded"),
    )),
    responses(
        (status = 200, description = "Logged in (JSON)", body = SessionView,
            headers(("set-cookie" = String, description = "cloudweb_session and cloudweb_csrf"))),
        (status = 303, description = "Logged in (form): go to `next`"),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "Wrong name or password", body = ErrorBody),
        (status = 403, description = "Sent from another origin", body = ErrorBody),
        (status = 429, description = "Too many attempts for this account or address", body = ErrorBody,
            headers(("retry-after" = u64, description = "Seconds until attempts are allowed again"))),
    ))]
pub async fn login(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let address = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    // A cross-site login would log a victim into the attacker's account.
    guard::same_origin(&headers)?;
    let bytes = axum::body::to_bytes(body, crate::error::MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::TooLarge("request body is larger than 1 MiB".to_string()))?;
    let is_form = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"));
    let login: LoginRequest = if is_form {
        let fields: Vec<(String, String)> = url::form_urlencoded::parse(&bytes).into_owned().collect();
        let get = |key: &str| fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let name = get("name");
        let password = get("password");
        let next = get("next");
        match (name, password) {
            (Some(name), Some(password)) => LoginRequest { name, password, next },
            _ => return Err(ApiError::BadRequest("the form needs the fields name and password".to_string())),
        }
    } else {
        parse_json(&bytes)?
    };
    let next = match &login.next {
        Some(next) if is_form => local_path(next)?,
        _ => "/".to_string(),
    };
    let user = check_login(&state, &login.name, &login.password, address).await?;
    // A new login replaces the session this browser had.
    if let Some(old) = sessions::session_cookie(&headers) {
        state.store.delete_session(&crate::ca::sha256_hex(old.as_bytes())).await?;
    }
    let session = sessions::start(&state, &user.id).await?;
    let cookies = sessions::set_cookie_headers(&state, &headers, &session);
    let mut response = if is_form {
        let mut response = StatusCode::SEE_OTHER.into_response();
        response.headers_mut().insert(LOCATION, next.parse().map_err(|_| ApiError::BadRequest("invalid next path".to_string()))?);
        response
    } else {
        Json(SessionView {
            user: user_view(&user),
            csrf_token: session.csrf_token.clone(),
            expires_at: rfc3339_ms(session.expires_at),
            idle_timeout_seconds: state.config.auth.session_idle.as_secs(),
        })
        .into_response()
    };
    for cookie in cookies {
        response.headers_mut().append(SET_COOKIE, cookie);
    }
    Ok(response)
}

/// Checks a name and password under the login rate limits (per account
/// and per address): the user, or 401 (wrong name or password) / 429.
/// Shared by `POST /api/session` and the dashboard's login form.
pub async fn check_login(state: &AppState, name: &str, password: &str, address: Option<std::net::IpAddr>) -> Result<UserRow, ApiError> {
    if name.is_empty() || name.len() > users::MAX_NAME_CHARS || password.len() > users::MAX_PASSWORD_BYTES {
        return Err(ApiError::Unauthorized("wrong name or password".to_string()));
    }
    if state.store.engine() == crate::store::Engine::Postgres {
        // Other replicas count attempts too: start from what they stored.
        // Unreadable, this replica's own counts decide.
        let keys = state.auth.limiter.stored_keys(name, address);
        match state.store.login_windows(&keys).await {
            Ok(stored) => state.auth.limiter.merge(&keys, &stored, state.clock.now_ms()),
            Err(err) => tracing::warn!(error = %err, "cannot read the login counts other replicas stored"),
        }
    }
    let begun = match state.auth.limiter.begin(name, address, state.clock.now_ms()) {
        Ok(begun) => begun,
        Err(retry) => {
            // Names are not logged before they are known to be names: people
            // type passwords into the name field.
            tracing::warn!(address = ?address, "login refused: too many attempts");
            login_entry(state, None, address, "password", "refused: too many attempts").await;
            return Err(ApiError::TooManyRequests {
                message: format!("too many login attempts; try again in {} seconds", retry.0),
                retry_after_s: retry.0,
            });
        }
    };
    store_login_attempts(state, &begun.changes).await;
    // Past the account's limit (from other addresses), the attempt waits
    // its turn; see the limiter.
    if !begun.wait.is_zero() {
        tokio::time::sleep(begun.wait).await;
    }
    let Some(user) = users::check_password(state, name, password).await? else {
        match state.store.user_by_name(name).await? {
            Some(user) => {
                tracing::info!(user = %user.name, address = ?address, "login failed");
                login_entry(state, Some(&user.id), address, "password", "refused: wrong password").await;
            }
            None => {
                tracing::info!(address = ?address, "login failed: unknown name");
                login_entry(state, None, address, "password", "refused: unknown name").await;
            }
        }
        return Err(ApiError::Unauthorized("wrong name or password".to_string()));
    };
    let changes = state.auth.limiter.succeeded(name, address, state.clock.now_ms());
    store_login_attempts(state, &changes).await;
    login_entry(state, Some(&user.id), address, "password", "ok").await;
    Ok(user)
}

/// A login's audit entry. A name nobody has is not written down (people
/// type passwords into the name field): the entry says `anonymous`.
pub async fn login_entry(state: &AppState, user_id: Option<&str>, address: Option<std::net::IpAddr>, method: &str, result: &str) {
    let entry = crate::access::audit::Entry {
        request_id: crate::access::audit::request_id(),
        phase: "event",
        actor: user_id.map_or_else(|| "anonymous".to_string(), |id| format!("user:{id}")),
        source: address.map(|a| a.to_string()),
        action: format!("login ({method})"),
        result: result.to_string(),
        ..Default::default()
    };
    crate::access::audit::after(state, entry).await;
}

/// Writes the limiter's changes, so that a restart keeps the counts. The
/// limiter in memory decides either way: a failed write (a full disk) is
/// logged and does not turn logins away.
async fn store_login_attempts(state: &AppState, changes: &[crate::auth::limiter::Change]) {
    let over = state.clock.now_ms() - state.auth.limiter.window_ms();
    if let Err(err) = state.store.save_login_attempts(changes, over).await {
        tracing::warn!(error = %err, "cannot store the login attempt counts; they hold until the next restart only");
    }
}

/// A path on this host (`/…`, not `//host…`), for redirects.
fn local_path(next: &str) -> Result<String, ApiError> {
    let ok = next.starts_with('/') && !next.starts_with("//") && !next.contains('\\') && next.len() <= 2048 && !next.chars().any(char::is_control);
    if ok {
        Ok(next.to_string())
    } else {
        Err(ApiError::BadRequest("next must be a path on this host, starting with a single /".to_string()))
    }
}

/// Log out: ends the session on the server and clears the cookies.
#[utoipa::path(delete, path = "/api/session", operation_id = "auth_logout", tag = "accounts",
    responses(
        (status = 204, description = "The session is ended"),
        (status = 400, description = "The request was not made with a session", body = ErrorBody),
    ))]
pub async fn logout(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>, headers: HeaderMap) -> Result<Response, ApiError> {
    let Principal::User { via: Via::Session { id_sha256, .. }, user } = &principal else {
        return Err(ApiError::BadRequest("this request is not made with a session; revoke a token with DELETE /api/tokens/{id}".to_string()));
    };
    sessions::end(&state, id_sha256).await?;
    tracing::info!(user = %user.name, "session ended by logout");
    let mut response = StatusCode::NO_CONTENT.into_response();
    for cookie in sessions::clear_cookie_headers(&state, &headers) {
        response.headers_mut().append(SET_COOKIE, cookie);
    }
    Ok(response)
}

/// Who is calling, and (for a session) its CSRF token.
#[utoipa::path(get, path = "/api/me", operation_id = "auth_me", tag = "accounts", responses((status = 200, description = "The caller", body = MeView)))]
pub async fn me(Extension(principal): Extension<Principal>, Extension(access): Extension<crate::access::Access>) -> Json<MeView> {
    let mut me = match principal {
        Principal::Admin => MeView { auth: "admin_token".to_string(), ..MeView::default() },
        Principal::Deploy { .. } => MeView { auth: "deploy_token".to_string(), ..MeView::default() },
        Principal::User { user, via: Via::Token { .. } } => MeView { auth: "api_token".to_string(), user: Some(user_view(&user)), ..MeView::default() },
        Principal::User { user, via: Via::Session { csrf_token, expires_at, .. } } => MeView {
            auth: "session".to_string(),
            user: Some(user_view(&user)),
            csrf_token: Some(csrf_token),
            session_expires_at: Some(rfc3339_ms(expires_at)),
            ..MeView::default()
        },
    };
    me.cluster_role = access.cluster.map(|role| role.as_str().to_string());
    me.teams = access.grants.iter().map(|g| cloudweb_api_types::teams::TeamRoleView { team: g.team_name.clone(), role: g.role.as_str().to_string() }).collect();
    me.apps = access.apps.clone();
    Json(me)
}

fn token_owner(principal: &Principal) -> Result<&UserRow, ApiError> {
    principal.user().ok_or_else(|| {
        ApiError::Forbidden("personal API tokens belong to a user; the admin token has none (log in as a user)".to_string())
    })
}

/// The caller's personal API tokens, newest first (revoked ones too).
#[utoipa::path(get, path = "/api/tokens", operation_id = "tokens_list", tag = "accounts",
    responses(
        (status = 200, description = "The tokens, without their secrets", body = Vec<TokenView>),
        (status = 403, description = "Called with the admin token", body = ErrorBody),
    ))]
pub async fn list_tokens(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>) -> Result<Json<Vec<TokenView>>, ApiError> {
    let user = token_owner(&principal)?;
    Ok(Json(state.store.api_tokens_of(&user.id).await?.iter().map(token_view).collect()))
}

/// Creates a personal API token; the answer is the only time it is shown.
#[utoipa::path(post, path = "/api/tokens", operation_id = "tokens_create", tag = "accounts", request_body = NewTokenRequest,
    responses(
        (status = 201, description = "Created; `token` is shown only now", body = CreatedTokenView),
        (status = 400, description = "Invalid name", body = ErrorBody),
        (status = 403, description = "Called with the admin token", body = ErrorBody),
        (status = 409, description = "A token of that name exists, or too many tokens", body = ErrorBody),
    ))]
pub async fn create_token(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<CreatedTokenView>), ApiError> {
    let user = token_owner(&principal)?;
    let request: NewTokenRequest = parse_json(&crate::error::body_bytes(body)?)?;
    let role = match request.role.as_deref() {
        None => None,
        Some(text) => Some(crate::access::Role::parse(text).ok_or_else(|| {
            ApiError::BadRequest(format!("role: unknown role {text:?} (viewer, deployer, admin, owner, cluster-viewer or cluster-admin)"))
        })?),
    };
    let expires_at = expiry(request.expires_at.as_deref())?;
    // A token made with a scoped token is held to that token's scope too.
    if let Principal::User { via: Via::Token { scope, .. }, .. } = &principal {
        if scope.role.is_some() || scope.apps.is_some() {
            return Err(ApiError::Forbidden("a scoped token cannot make tokens; use a session or an unscoped token".to_string()));
        }
    }
    let scope = tokens::NewScope { role, apps: request.apps, expires_at };
    crate::access::teams::check_token_scope(&state, user, &scope).await?;
    let (row, token) = tokens::create(&state, user, &request.name, scope).await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedTokenView { id: row.id, name: row.name, prefix: row.prefix, created_at: rfc3339_ms(row.created_at), token }),
    ))
}

/// Revokes one of the caller's tokens; it stops working at once.
#[utoipa::path(delete, path = "/api/tokens/{id}", operation_id = "tokens_revoke", tag = "accounts",
    params(("id" = String, Path, description = "The token's id")),
    responses(
        (status = 204, description = "Revoked (or already revoked)"),
        (status = 403, description = "Called with the admin token", body = ErrorBody),
        (status = 404, description = "The caller has no token with that id", body = ErrorBody),
    ))]
pub async fn revoke_token(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let user = token_owner(&principal)?;
    tokens::revoke(&state, user, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Every user, by name.
#[utoipa::path(get, path = "/api/users", operation_id = "users_list", tag = "accounts", responses((status = 200, description = "The users", body = Vec<UserView>)))]
pub async fn list_users(State(state): State<Arc<AppState>>) -> Result<Json<Vec<UserView>>, ApiError> {
    Ok(Json(state.store.users().await?.iter().map(user_view).collect()))
}

/// Creates a user who logs in with a name and password (the first user
/// comes from `cloudweb-server admin create-user`).
#[utoipa::path(post, path = "/api/users", operation_id = "users_create", tag = "accounts", request_body = NewUserRequest,
    responses(
        (status = 201, description = "Created", body = UserView),
        (status = 400, description = "Invalid name or password", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
    ))]
pub async fn create_user(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<UserView>), ApiError> {
    let request: NewUserRequest = parse_json(&crate::error::body_bytes(body)?)?;
    let cluster_role = parse_cluster_role(request.cluster_role.as_deref())?;
    let user = users::create(&state.store, state.clock.now_ms(), &request.name, Some(&request.password), cluster_role).await?;
    let by = principal.user().map_or("the admin token", |u| u.name.as_str()).to_string();
    tracing::info!(user = %user.name, by = %by, "user created");
    Ok((StatusCode::CREATED, Json(user_view(&user))))
}

/// Disables a user: their sessions end and their tokens stop working at
/// once, and they can no longer log in. The row stays (names are not
/// reused). Nobody disables themselves.
#[utoipa::path(delete, path = "/api/users/{id}", operation_id = "users_disable", tag = "accounts",
    params(("id" = String, Path, description = "The user's id")),
    responses(
        (status = 204, description = "Disabled (or already disabled)"),
        (status = 404, description = "No such user", body = ErrorBody),
        (status = 409, description = "That is the caller", body = ErrorBody),
    ))]
pub async fn disable_user(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if principal.user().is_some_and(|u| u.id == id) {
        return Err(ApiError::Conflict("you cannot disable yourself".to_string()));
    }
    let sole = state.store.teams_owned_only_by(&id).await?;
    if !sole.is_empty() {
        return Err(ApiError::Conflict(format!("the user is the only owner of team {}: make someone else owner first (a team always has an owner)", sole.join(", "))));
    }
    let user = state.store.disable_user(&id, state.clock.now_ms()).await?.ok_or_else(|| ApiError::NotFound(format!("no user {id:?}")))?;
    tracing::info!(user = %user.name, "user disabled");
    Ok(StatusCode::NO_CONTENT)
}

/// A cluster role as the API names it.
pub fn parse_cluster_role(text: Option<&str>) -> Result<Option<crate::access::ClusterRole>, ApiError> {
    match text {
        None => Ok(None),
        Some(text) => crate::access::ClusterRole::parse(text)
            .map(Some)
            .ok_or_else(|| ApiError::BadRequest(format!("cluster_role: unknown role {text:?} (cluster-admin or cluster-viewer)"))),
    }
}

/// A token's end, from RFC 3339 (`None`: no end).
pub fn expiry(text: Option<&str>) -> Result<Option<i64>, ApiError> {
    text.map(|text| crate::clock::parse_rfc3339_ms(text).ok_or_else(|| ApiError::BadRequest("expires_at: use RFC 3339, e.g. 2027-01-31T00:00:00Z".to_string())))
        .transpose()
}
