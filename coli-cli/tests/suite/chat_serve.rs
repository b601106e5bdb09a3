//! `coli chat` driven through its standard input, and `coli serve` as a process: it
//! listens, answers, and exits 0 on SIGTERM after saving its slots.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn chat_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    coli_tests::synthetic::write_chat_model(dir.path()).unwrap();
    dir
}

/// `coli chat` on `model` with every stream piped.
fn spawn_chat(model: &std::path::Path, max_tokens: usize) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_coli"))
        .args([
            "chat",
            "--no-usage",
            "--max-tokens",
            &max_tokens.to_string(),
            "--model",
        ])
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn chat_answers_keeps_history_and_saves_the_conversation() {
    let model = chat_model();
    let saved = model.path().join("conversation.json");
    let mut child = spawn_chat(model.path(), 6);
    let script = format!(
        "Hello there\n/stats\nSecond question \\\ncontinued\n/system Be brief.\nThird\n/save {}\n/quit\n",
        saved.display()
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // A stats line after each answer; the second turn reused the first one's KV.
    let stats: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("[") && l.contains("tok/s"))
        .collect();
    assert!(stats.len() >= 4, "{stderr}"); // three answers and /stats
    assert!(
        stats
            .iter()
            .all(|l| l.contains("TTFT") && l.contains("expert hit rate")),
        "{stderr}"
    );
    let reused: Vec<usize> = stats
        .iter()
        .filter_map(|l| l.split('(').nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert!(
        reused.get(2).is_some_and(|&r| r > 0),
        "turn 2 reuses turn 1: {stderr}"
    );
    assert!(stderr.contains("system prompt set"), "{stderr}");
    let conv: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let msgs = conv["messages"].as_array().unwrap();
    // /system cleared the history: the system prompt, the third question, its answer.
    assert_eq!(msgs.len(), 3, "{conv}");
    assert_eq!(msgs[0]["role"], "system");
    assert_eq!(msgs[0]["content"], "Be brief.");
    assert_eq!(msgs[1]["content"], "Third");
    assert_eq!(msgs[2]["role"], "assistant");
}

#[test]
fn ctrl_c_stops_the_answer_and_the_chat_goes_on() {
    let model = chat_model();
    let mut child = spawn_chat(model.path(), 3000);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Tell me a long story\n").unwrap();
    stdin.flush().unwrap();
    // Read the answer as it streams; interrupt once it has started.
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < 16 && Instant::now() < deadline {
        if let Ok(b) = rx.recv_timeout(Duration::from_millis(100)) {
            seen.extend(b);
        }
    }
    assert!(seen.len() >= 16, "no answer streamed");
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    // The chat is still there: a second question is answered, then /quit leaves with 0.
    stdin.write_all(b"Now a short one\n/quit\n").unwrap();
    drop(stdin);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    while let Ok(b) = rx.try_recv() {
        seen.extend(b);
    }
    let out = String::from_utf8_lossy(&seen);
    assert!(status.success(), "{stderr}");
    assert!(out.contains("[stopped]"), "{out}");
    let stats = stderr
        .lines()
        .filter(|l| l.starts_with("[") && l.contains("tok/s"))
        .count();
    assert_eq!(stats, 2, "both answers end with their stats line: {stderr}");
}

#[test]
fn chat_refuses_a_model_without_a_template() {
    let model = chat_model();
    std::fs::remove_file(model.path().join("tokenizer_config.json")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(["chat", "--no-usage", "--model"])
        .arg(model.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("chat_template"));
}

#[test]
fn serve_answers_and_exits_cleanly_on_sigterm() {
    let model = chat_model();
    let kv = model.path().join("kv");
    let mut child = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args([
            "serve",
            "--no-usage",
            "--port",
            "0",
            "--slots",
            "2",
            "--ctx",
            "256",
            "--kv-dir",
        ])
        .arg(&kv)
        .arg("--model")
        .arg(model.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let t0 = Instant::now();
    let addr = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "serve ended early");
        if let Some(rest) = line.split("on http://").nth(1) {
            break rest.split(' ').next().unwrap().to_string();
        }
        assert!(t0.elapsed() < Duration::from_secs(60));
    };
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
    let mut c = TcpStream::connect(&addr).unwrap();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("\"chat.completion\""), "{resp}");
    let pid = child.id() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert_eq!(status.code(), Some(0), "{rest}");
    assert!(rest.contains("server stopped"), "{rest}");
    assert!(
        std::fs::read_dir(&kv).unwrap().count() >= 1,
        "the slots were saved"
    );
}
