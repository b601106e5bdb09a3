//! Text ↔ ids through `tokenizer.json` (the `tokenizers` crate) and the chat
//! template of `tokenizer_config.json` (rendered with minijinja as `transformers`
//! renders it with jinja2: trim_blocks and lstrip_blocks on).

use std::path::Path;

use serde_json::Value;

use crate::error::{ModelError, Result};

/// A tokenizer with its chat template and special tokens.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

/// One chat message.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl TextTokenizer {
    /// Loads `tokenizer.json` (required) and `tokenizer_config.json` (optional) from `dir`.
    pub fn load(dir: &Path) -> Result<TextTokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ModelError::Tokenizer(format!(
                "{} not found (pass --prompt-ids to run without a tokenizer)",
                path.display()
            )));
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                ModelError::Tokenizer(format!("{}: not valid JSON: {e}", cfg_path.display()))
            })?,
            Err(_) => Value::Null,
        };
        let chat_template = match cfg.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or(list.first())
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .map(str::to_string),
            _ => None,
        };
        Ok(TextTokenizer {
            inner,
            chat_template,
            bos_token: token_string(cfg.get("bos_token")),
            eos_token: token_string(cfg.get("eos_token")),
        })
    }

    /// Text to ids. Special tokens written in the text (e.g. `<|im_start|>`) are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Ids to text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    /// The id of a token string, if it exists.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The raw bytes each token id stands for (for grammar masks): GPT-2 byte-level
    /// tokens are mapped back through the byte alphabet, SentencePiece byte tokens
    /// `<0xNN>` become that byte and `▁` a space; special (added) tokens get no bytes, so a
    /// grammar never allows them.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let n = self.inner.get_vocab_size(true);
        let vocab = self.inner.get_vocab(true);
        let byte_level = vocab.keys().any(|t| t.starts_with('\u{120}'));
        let special: std::collections::HashSet<u32> = self
            .inner
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        // GPT-2's bytes_to_unicode, inverted.
        let mut inverse = std::collections::HashMap::new();
        let mut extra = 0u32;
        for b in 0u32..256 {
            let printable = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            let c = if printable {
                b
            } else {
                extra += 1;
                255 + extra
            };
            inverse.insert(char::from_u32(c).expect("code point"), b as u8);
        }
        let mut out = vec![Vec::new(); n];
        for (tok, &id) in &vocab {
            if special.contains(&id) || id as usize >= n {
                continue;
            }
            out[id as usize] =
                if let Some(hex) = tok.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
                    u8::from_str_radix(hex, 16)
                        .map(|b| vec![b])
                        .unwrap_or_default()
                } else if byte_level {
                    tok.chars()
                        .map(|c| inverse.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_default()
                } else {
                    tok.replace('\u{2581}', " ").into_bytes()
                };
        }
        out
    }

    /// The end-of-sequence token of `tokenizer_config.json`, as an id.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_id(t))
    }

    /// Whether a chat template is available.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders the chat template over `messages`.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            ModelError::Template("tokenizer_config.json has no chat_template".into())
        })?;
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        env.render_str(template, ctx)
            .map_err(|e| ModelError::Template(e.to_string()))
    }

    /// An incremental decoder for streaming output.
    pub fn stream(&self) -> TokenStream<'_> {
        TokenStream {
            inner: self.inner.decode_stream(true),
        }
    }
}

/// Incremental detokenization: yields only complete UTF-8 text, in constant time per token.
pub struct TokenStream<'t> {
    inner: tokenizers::DecodeStream<
        't,
        tokenizers::ModelWrapper,
        tokenizers::NormalizerWrapper,
        tokenizers::PreTokenizerWrapper,
        tokenizers::PostProcessorWrapper,
        tokenizers::DecoderWrapper,
    >,
}

impl TokenStream<'_> {
    /// Adds a token; returns newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let piece = self
            .inner
            .step(id)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(piece.unwrap_or_default())
    }
}
