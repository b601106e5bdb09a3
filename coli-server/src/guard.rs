//! Who may talk to the server: the Host header must name the bound address, localhost, an
//! IP address or an `--allow-host` (a DNS-rebinding guard: a web page cannot reach a local
//! server under its own domain name), and with an API key every request but `/health` must carry
//! `Authorization: Bearer KEY` (compared in constant time).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::http::AppState;
use crate::openai::ApiError;

/// The middleware: 403 for a foreign Host, 401 without the key; with `--cors-origin`,
/// preflights are answered and responses carry the CORS headers (none are sent otherwise).
pub async fn check(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(origin) = st.cfg.cors_origin.clone() else {
        return guarded(&st, req, next).await;
    };
    let mut resp = if req.method() == axum::http::Method::OPTIONS {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(
            "access-control-allow-methods",
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            "access-control-allow-headers",
            HeaderValue::from_static("authorization, content-type"),
        );
        h.insert("access-control-max-age", HeaderValue::from_static("600"));
        r
    } else {
        guarded(&st, req, next).await
    };
    if let Ok(v) = HeaderValue::from_str(&origin) {
        resp.headers_mut().insert("access-control-allow-origin", v);
    }
    resp
}

async fn guarded(st: &AppState, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !host_allowed(host, &st.cfg.allowed_hosts()) {
        st.sched.shared.metrics.record_request("guard", 403);
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            format!("Host {host:?} is not allowed (bound address, localhost, or --allow-host)"),
        )
        .into_response();
    }
    if let Some(key) = &st.cfg.api_key {
        let path = req.uri().path();
        let given = req
            .headers()
            .get("authorization")
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap_or("");
        if path != "/health" && !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            st.sched.shared.metrics.record_request("guard", 401);
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key (Authorization: Bearer KEY)",
            )
            .code("invalid_api_key")
            .into_response();
        }
    }
    next.run(req).await
}

/// Whether `host` (a Host header: name or address, optional port) is one of `allowed`,
/// or an IP address literal: DNS rebinding needs a domain name, and a gateway or a probe
/// reaching a pod by its address must get through.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = strip_port(host).to_ascii_lowercase();
    name.parse::<std::net::IpAddr>().is_ok()
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(&name))
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest.split(']').next().unwrap_or("");
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// Equality whose time does not depend on where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0 && a.len() == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_with_and_without_ports() {
        let allowed: Vec<String> = ["127.0.0.1", "localhost", "::1", "example.org"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for ok in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:80",
            "example.org",
            "10.1.2.3:8000",
            "[fe80::1]",
        ] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for bad in [
            "evil.com",
            "evil.com:8080",
            "",
            "localhost.evil.com",
            "10.1.2.3.evil.com",
        ] {
            assert!(!host_allowed(bad, &allowed), "{bad}");
        }
    }

    #[test]
    fn key_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
