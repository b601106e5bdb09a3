//! `coli serve`: an OpenAI-compatible server (coli-server) over one loaded model.

use std::sync::Arc;

use coli_server::{ServeConfig, Server};

use crate::args::ServeArgs;
use crate::Outcome;

pub(crate) fn serve(a: ServeArgs) -> Outcome {
    let engine = Arc::new(crate::run::open(&a.m, a.drafts.mtp())?);
    let max_ctx = engine.model().info.max_position_embeddings.max(2);
    let ctx = a.ctx.unwrap_or(max_ctx.min(4096));
    if ctx > max_ctx {
        eprintln!("coli: warning: --ctx {ctx} is beyond the model's trained context ({max_ctx})");
    }
    if a.body_limit_mb.is_nan() || a.body_limit_mb <= 0.0 {
        return Err("--body-limit-mb must be positive".into());
    }
    let cfg = ServeConfig {
        host: a.host,
        port: a.port,
        slots: a.slots,
        queue: a.queue,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        ctx,
        kv_dir: a.kv_dir,
        allow_hosts: a.allow_host,
        body_limit: (a.body_limit_mb * 1e6) as usize,
        cors_origin: a.cors_origin,
        threads: crate::threads(&a.m),
        drafts: coli_server::ServeDrafts {
            forced: a.drafts.draft != crate::args::DraftArg::Off,
            lookup: a.drafts.lookup(),
            mtp: a.drafts.mtp(),
            mtp_depth: a.drafts.mtp_depth as usize,
        },
    };
    a.drafts.note_without_mtp(&engine);
    let kv_bytes = coli_models::arch::KvCache::bytes_for(engine.model(), ctx) * cfg.slots;
    let auth = if cfg.api_key.is_some() {
        "API key required"
    } else {
        "no API key"
    };
    let mut server = Server::start(engine.clone(), cfg.clone())?;
    eprintln!(
        "coli: serving {} on http://{} ({} slots x {ctx} positions, KV {:.2} GB, queue {}, {auth}); Ctrl-C or SIGTERM stops",
        engine.dir().display(),
        server.addr(),
        cfg.slots,
        kv_bytes as f64 / 1e9,
        cfg.queue
    );
    server.join()?;
    if !a.m.no_usage {
        let _ = engine.save_usage();
    }
    eprintln!("coli: server stopped");
    Ok(0)
}
