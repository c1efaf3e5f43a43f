//! `headcount serve`.

use std::process::ExitCode;

use headcount_runtime::{Error, Result};
use headcount_serve::{ServeError, ServeOptions};

use crate::args::ServeArgs;

pub fn run(a: &ServeArgs, quiet: bool) -> Result<ExitCode> {
    let model = crate::generate::load(&a.model, &a.runtime, a.max_batch, quiet)?;
    let opts = ServeOptions {
        host: a.host.clone(),
        port: a.port,
        max_batch: a.max_batch,
        kv_cache_memory: a.kv_cache_memory,
        max_queue: a.max_queue,
        max_model_len: a.max_model_len,
        prefill_chunk: a.prefill_chunk,
        model_name: a.served_model_name.clone().unwrap_or_else(|| a.model_name.clone()),
        quiet,
        allowed_origins: a.allowed_origins.clone(),
        reasoning: a.reasoning_parser.map(Into::into),
        speculative_tokens: a.runtime.speculative_tokens,
        tool_call_parser: a.tool_call_parser.map(Into::into),
        prefix_caching: if a.no_enable_prefix_caching {
            headcount_serve::PrefixCaching::Off
        } else {
            headcount_serve::PrefixCaching::On
        },
        prefix_cache_memory: a.prefix_cache_memory,
        responses_store: a.responses_store,
    };
    match headcount_serve::serve(model, &a.model, &opts) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(ServeError::Runtime(e)) => Err(e),
        Err(ServeError::Setup(msg)) => Err(Error::InvalidArgument(msg)),
    }
}
