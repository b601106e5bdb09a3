//! Text ↔ ids through `tokenizer.json` (the `tokenizers` crate), with the chat
//! template and special tokens of `tokenizer_config.json` (rendering is in
//! [`crate::chat_template`]).

use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;

pub use crate::chat_template::ChatMessage;
use crate::chat_template::{ChatRequest, ChatTemplate, SpecialTokens};
use crate::error::{ModelError, Result};

/// A tokenizer with its chat template and special tokens.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    /// Compiled on first use (a template that does not compile fails the render, not the load).
    compiled: OnceLock<std::result::Result<ChatTemplate, String>>,
    special: SpecialTokens,
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
        // transformers also reads special_tokens_map.json; tokenizer_config.json wins.
        let map: Value = std::fs::read_to_string(dir.join("special_tokens_map.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null);
        let special = SpecialTokens::from_config(&cfg).or(SpecialTokens::from_config(&map));
        Ok(TextTokenizer {
            inner,
            chat_template,
            compiled: OnceLock::new(),
            special,
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
        self.special
            .eos_token
            .as_deref()
            .and_then(|t| self.token_id(t))
    }

    /// Whether a chat template is available.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// The chat template's source, as `tokenizer_config.json` spells it.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The special tokens passed to the chat template.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// Renders the chat template over `req` as transformers' `apply_chat_template` would.
    pub fn render_chat(&self, req: &ChatRequest) -> Result<String> {
        let source = self.chat_template.as_deref().ok_or_else(|| {
            ModelError::Template("tokenizer_config.json has no chat_template".into())
        })?;
        let compiled = self.compiled.get_or_init(|| {
            ChatTemplate::new(source).map_err(|e| match e {
                ModelError::Template(msg) => msg,
                other => other.to_string(),
            })
        });
        match compiled {
            Ok(template) => template.render(&self.special, req),
            Err(e) => Err(ModelError::Template(e.clone())),
        }
    }

    /// Renders the chat template over typed `messages`, without tools or extra kwargs.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let messages: Vec<Value> = messages.iter().map(ChatMessage::to_value).collect();
        self.render_chat(&ChatRequest {
            messages: &messages,
            tools: None,
            add_generation_prompt,
            extra: &serde_json::Map::new(),
        })
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
