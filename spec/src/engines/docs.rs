//! The engine rules' table of docs/ENGINES.md: each rule's code, title and sources.

use super::*;

/// One engine rule's entry in docs/ENGINES.md: the code, what it checks, and for each
/// engine that has it, the condition and where its source checks it.
pub struct EngineRuleDoc {
    pub code: &'static str,
    pub title: &'static str,
    pub by: Vec<(Engine, &'static str, &'static str)>,
}

/// Each engine rule's code and what it checks, in code order.
pub(super) const TITLES: &[(&str, &str)] = &[
    ("HC2001", "query heads over tensor parallelism"),
    ("HC2002", "kv heads over tensor parallelism"),
    ("HC2003", "vocabulary over tensor parallelism"),
    ("HC2004", "dense MLP and shared experts over tensor parallelism"),
    ("HC2005", "routed experts' width over the experts' tensor parallelism"),
    ("HC2006", "experts over expert parallelism"),
    ("HC2007", "vLLM's expert-parallel size"),
    ("HC2008", "more tensor-parallel ranks than experts"),
    ("HC2009", "expert parallelism within tensor parallelism"),
    ("HC2010", "attention data parallelism"),
    ("HC2011", "ranks over nodes"),
    ("HC2012", "layers over pipeline stages"),
    ("HC2013", "a layer for every stage"),
    ("HC2014", "the world over expert groups"),
    ("HC2015", "FP8 blocks: rows of a column-parallel weight"),
    ("HC2016", "FP8 blocks: columns of a row-parallel weight"),
    ("HC2017", "FP8 blocks: an expert's gate/up rows"),
    ("HC2018", "FP8 blocks: an expert's down columns"),
    ("HC2019", "transformers' expert-parallel size"),
    ("HC2020", "a pipeline stage that begins on a shared sparse-attention indexer"),
    ("HC2021", "speculative decoding needs the config's MTP layers"),
    ("HC2022", "speculative tokens over the MTP layers"),
    ("HC2023", "an axis the engine has no flag for"),
    ("HC2024", "decode context parallelism over the tensor-parallel ranks"),
    ("HC2025", "decode context parallelism and kv heads"),
    ("HC2026", "decode and prefill context parallelism together"),
    ("HC2027", "the sequence over context-parallel chunks"),
    ("HC2028", "sequence parallelism without tensor parallelism"),
    ("HC2029", "the sequence over tensor parallelism under sequence parallelism"),
    ("HC2030", "overlapped tensor-parallel communication"),
    ("HC2031", "the interleaved schedule without stages"),
    ("HC2032", "layers over virtual pipeline stages"),
    ("HC2033", "attention context parallelism within tensor parallelism"),
    ("HC2034", "attention data and context parallelism within tensor parallelism"),
    ("HC2035", "MoE data parallelism within tensor parallelism"),
    ("HC2036", "expert and MoE data parallelism over tensor parallelism"),
    ("HC2037", "redundant experts without load balancing"),
    ("HC2038", "load balancing without expert parallelism"),
    ("HC2039", "routed and redundant experts over expert parallelism"),
    ("HC2040", "MoE data parallelism with pipeline stages"),
    ("HC2041", "MoE data parallelism against attention context parallelism"),
    ("HC2042", "prefill context parallelism with data parallelism"),
    ("HC2043", "AWQ and GPTQ: whole quantization groups on a rank"),
    ("HC2044", "AWQ and GPTQ Marlin: a rank's weight in Marlin's thread tile"),
    ("HC2045", "Marlin repack: a rank's weight in the 64 x 16 tile"),
    ("HC2046", "vision tower heads over tensor parallelism"),
    ("HC2047", "vision tower widths over tensor parallelism"),
    ("HC2048", "sparse attention with linear biases"),
    ("HC2049", "sparse attention over tensor parallelism without sequence parallelism"),
    ("HC2050", "shared indexers in a period and offset"),
    ("HC2051", "sparse attention's indexer head size"),
];

/// Every engine rule with each engine's condition and source (docs/ENGINES.md is generated
/// from this by spec/tests/engines.rs).
pub fn rule_docs() -> Vec<EngineRuleDoc> {
    let rows = |e: Engine| match e {
        Engine::Vllm => vllm::DOCS,
        Engine::Sglang => sglang::DOCS,
        Engine::Megatron => megatron::DOCS,
        Engine::Transformers => transformers::DOCS,
    };
    TITLES
        .iter()
        .map(|&(code, title)| EngineRuleDoc {
            code,
            title,
            by: Engine::ALL
                .iter()
                .flat_map(|&e| rows(e).iter().filter(move |d| d.0 == code).map(move |&(_, c, s)| (e, c, s)))
                .collect(),
        })
        .collect()
}
