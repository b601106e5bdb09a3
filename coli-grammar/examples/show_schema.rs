//! Prints the GBNF of a JSON Schema file: `cargo run -p coli-grammar --example show_schema FILE`.
fn main() {
    let path = std::env::args().nth(1).expect("usage: show_schema FILE");
    let text = std::fs::read_to_string(&path).expect("readable file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let schema = v.get("schema").unwrap_or(&v);
    match coli_grammar::schema_to_gbnf(schema) {
        Ok(g) => print!("{g}"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
