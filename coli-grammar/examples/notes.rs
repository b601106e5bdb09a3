//! Prints, for each JSON Schema file given (or the corpus), its warnings and relaxations.
fn main() {
    let files: Vec<String> = std::env::args().skip(1).collect();
    let items: Vec<(String, serde_json::Value)> = if files.is_empty() {
        coli_grammar::corpus::corpus()
            .unwrap()
            .into_iter()
            .map(|c| (c.name, c.schema))
            .collect()
    } else {
        files
            .iter()
            .map(|f| {
                let v: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
                (f.clone(), v.get("schema").cloned().unwrap_or(v))
            })
            .collect()
    };
    for (name, schema) in items {
        match coli_grammar::compile_schema(&schema.to_string()) {
            Ok(g) => {
                let c = coli_grammar::Compiled::new(&g);
                println!("{name}: ok, {} rules", g.rules.len());
                for w in c.warnings() {
                    println!("  warning: {w}");
                }
                for r in c.relaxations() {
                    println!("  relaxed: {r}");
                }
            }
            Err(e) => println!("{name}: error {e}"),
        }
    }
}
