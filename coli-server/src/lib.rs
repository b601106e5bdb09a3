//! coli-server: an OpenAI-compatible HTTP server over one loaded model.
//!
//! It holds HTTP and scheduling only; generation goes through `coli_models` (slots and
//! batched decode steps, [`coli_models::batch`]). Endpoints: `GET /health`,
//! `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`,
//! `POST /apply-template`, `POST /tokenize`, `POST /detokenize`, `GET /metrics`.
//!
//! * [`scheduler`]: the slots, the bounded queue, continuous batching.
//! * [`http`]: the endpoints (answers assembled in `respond`); [`openai`]: request
//!   shapes and the error shape;
//!   [`chat`]: templates, `response_format`, tools; [`stops`]: stop strings.
//! * [`guard`]: the Host guard and the API key; [`metrics`]: `/metrics`;
//!   [`kvfile`]: slots saved on shutdown and restored on start.

pub mod chat;
pub mod guard;
pub mod http;
pub mod kvfile;
pub mod metrics;
pub mod openai;
mod respond;
pub mod scheduler;
pub mod stops;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use coli_models::Engine;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Address to bind (127.0.0.1 by default).
    pub host: String,
    /// Port (0 picks a free one).
    pub port: u16,
    /// Sessions over the model, decoded together.
    pub slots: usize,
    /// Requests allowed to wait beyond the slots (then 429).
    pub queue: usize,
    /// Required bearer token.
    pub api_key: Option<String>,
    /// Positions per slot (prompt plus answer).
    pub ctx: usize,
    /// Where slots are saved on shutdown and restored on start.
    pub kv_dir: Option<PathBuf>,
    /// Host names accepted besides the bound address and localhost.
    pub allow_hosts: Vec<String>,
    /// Largest request body in bytes (then 413).
    pub body_limit: usize,
    /// Answer browsers from this origin (`*` for any) with CORS headers; none by default.
    pub cors_origin: Option<String>,
    /// Compute threads of the model (default: all cores).
    pub threads: Option<usize>,
    /// Which draft sources the slots use (speed only: the tokens are the same).
    pub drafts: ServeDrafts,
}

/// Draft sources of the server's slots: each step of a request also feeds the tokens its
/// sources guess, verified in the same batched forward (see [`coli_models::Engine::step`]).
#[derive(Clone, Debug)]
pub struct ServeDrafts {
    /// Tokens a `response_format` grammar forces.
    pub forced: bool,
    /// Prompt lookup (n-gram matches in the prompt and the text so far).
    pub lookup: bool,
    /// The checkpoint's MTP layer (`Auto`: when the model has one and its experts are not
    /// streamed).
    pub mtp: coli_models::MtpDrafting,
    /// Tokens the MTP layer drafts at a time.
    pub mtp_depth: usize,
}

impl Default for ServeDrafts {
    fn default() -> Self {
        ServeDrafts {
            forced: true,
            lookup: true,
            mtp: coli_models::MtpDrafting::Auto,
            mtp_depth: coli_models::mtp_drafts::DEFAULT_MTP_DEPTH,
        }
    }
}

impl ServeDrafts {
    /// No drafts.
    pub fn off() -> ServeDrafts {
        ServeDrafts {
            forced: false,
            lookup: false,
            mtp: coli_models::MtpDrafting::Off,
            mtp_depth: 0,
        }
    }

    /// The MTP depth the slots draft with on `engine`, when they draft with MTP at all.
    pub fn mtp_depth_on(&self, engine: &Engine) -> Option<usize> {
        let on = match self.mtp {
            coli_models::MtpDrafting::Off => false,
            coli_models::MtpDrafting::On => true,
            coli_models::MtpDrafting::Auto => engine.mtp_by_default(),
        };
        (on && self.mtp_depth > 0 && engine.model().mtp.is_some()).then_some(self.mtp_depth)
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            slots: 4,
            queue: 64,
            api_key: None,
            ctx: 4096,
            kv_dir: None,
            allow_hosts: Vec::new(),
            body_limit: 4 << 20,
            cors_origin: None,
            threads: None,
            drafts: ServeDrafts::default(),
        }
    }
}

impl ServeConfig {
    /// Host names the Host guard accepts.
    pub fn allowed_hosts(&self) -> Vec<String> {
        let mut v: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.push(self.host.trim_matches(|c| c == '[' || c == ']').to_string());
        v.extend(self.allow_hosts.iter().cloned());
        v
    }
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Server {
    /// Binds and starts serving `engine` on a thread of its own; returns once it listens.
    pub fn start(engine: Arc<Engine>, cfg: ServeConfig) -> Result<Server, String> {
        if cfg.slots == 0 {
            return Err("--slots must be at least 1".into());
        }
        if cfg.ctx < 2 {
            return Err("--ctx must be at least 2".into());
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port)))
            .map_err(|e| format!("cannot listen on {}:{}: {e}", cfg.host, cfg.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let persist = cfg.kv_dir.as_ref().map(|dir| scheduler::Persist {
            dir: dir.clone(),
            fingerprint: kvfile::fingerprint(engine.dir()),
        });
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(cfg.threads.unwrap_or(0))
            .thread_name(|i| format!("coli-compute-{i}"))
            .build()
            .map_err(|e| e.to_string())?;
        let (sched, worker) = scheduler::start(
            engine.clone(),
            pool,
            scheduler::Slots {
                count: cfg.slots,
                ctx: cfg.ctx,
                mtp_depth: cfg.drafts.mtp_depth_on(&engine),
            },
            cfg.queue,
            persist,
        );
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let state = Arc::new(http::AppState::new(engine, sched, cfg));
        let thread = std::thread::Builder::new()
            .name("coli-http".into())
            .spawn(move || {
                let app = http::router(state);
                let served = rt.block_on(async move {
                    axum::serve(listener, app)
                        .with_graceful_shutdown(async move {
                            tokio::select! {
                                _ = stop_rx => {}
                                _ = terminated() => {}
                            }
                        })
                        .await
                });
                // Every scheduler handle is gone with the router: the scheduler finishes
                // what runs, saves the slots and ends.
                drop(rt);
                worker
                    .join()
                    .map_err(|_| "the scheduler thread panicked".to_string())?;
                served.map_err(|e| e.to_string())
            })
            .map_err(|e| e.to_string())?;
        Ok(Server {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets in-flight requests finish, saves slots; returns when done.
    pub fn stop(mut self) -> Result<(), String> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.join()
    }

    /// Waits until the server ends (SIGTERM or Ctrl-C).
    pub fn join(&mut self) -> Result<(), String> {
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| "the HTTP thread panicked".to_string())?,
            None => Ok(()),
        }
    }
}

/// SIGTERM or Ctrl-C.
async fn terminated() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
