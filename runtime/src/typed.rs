//! Models of architectures declared in code. The declaration's consts are the truth: a
//! checkpoint whose config.json disagrees is refused with the differing field named, and
//! only the tensor-parallel sizes the declaration made legal compile.

use std::marker::PhantomData;
use std::path::Path;

use headcount_spec::{Architecture, Config, FieldValue, SupportsPipelineParallel, SupportsTensorParallel};

use crate::error::{Error, Result};
use crate::models::{LoadOptions, Model};
use crate::parallel::Parallel;

/// A GLM model of the declared architecture `A`.
pub struct Declared<A: Architecture> {
    model: Model,
    _arch: PhantomData<A>,
}

impl<A: Architecture> Declared<A> {
    /// Loads a checkpoint folder whose config.json must agree with `A`, as a run of one rank.
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Self> {
        Self::load_with(dir, opts, Parallel::single())
    }

    /// Loads this rank's part of a checkpoint for a run of `TP` tensor-parallel ranks in
    /// each of `PP` pipeline stages. Both must be sizes `A` declared (`tensor_parallel = [..]`,
    /// `pipeline_parallel = [..]`), or this does not compile; `parallel` must be a run of
    /// that shape ([`Parallel::join`]).
    pub fn load_rank<const TP: usize, const PP: usize>(
        dir: &Path,
        opts: &LoadOptions,
        parallel: Parallel,
    ) -> Result<Self>
    where
        A: SupportsTensorParallel<TP> + SupportsPipelineParallel<PP>,
    {
        Self::check_shape(&parallel, TP, PP)?;
        Self::load_with(dir, opts, parallel)
    }

    /// Seeded random weights of `A`'s shape, as a run of one rank.
    pub fn random(opts: &LoadOptions, seed: i64) -> Result<Self> {
        let model = Model::random_rank(&A::config(), &Self::options(opts), Parallel::single(), seed)?;
        Ok(Declared { model, _arch: PhantomData })
    }

    /// This rank's part of seeded random weights of `A`'s shape over `TP x PP` ranks.
    pub fn random_rank<const TP: usize, const PP: usize>(
        opts: &LoadOptions,
        parallel: Parallel,
        seed: i64,
    ) -> Result<Self>
    where
        A: SupportsTensorParallel<TP> + SupportsPipelineParallel<PP>,
    {
        Self::check_shape(&parallel, TP, PP)?;
        let model = Model::random_rank(&A::config(), &Self::options(opts), parallel, seed)?;
        Ok(Declared { model, _arch: PhantomData })
    }

    /// The untyped model.
    pub fn into_inner(self) -> Model {
        self.model
    }

    /// The untyped model, borrowed.
    pub fn model(&self) -> &Model {
        &self.model
    }

    fn check_shape(parallel: &Parallel, tp: usize, pp: usize) -> Result<()> {
        if parallel.tp != tp || parallel.pp != pp {
            return Err(Error::Parallel(format!(
                "{} was asked for {tp} x {pp} ranks, but this run is {} x {}",
                A::NAME,
                parallel.tp,
                parallel.pp
            )));
        }
        Ok(())
    }

    fn options(opts: &LoadOptions) -> LoadOptions {
        LoadOptions {
            kv_replication: A::KV_REPLICATION,
            vocab_padding: A::VOCAB_PADDING as usize, // cannot wrap: usize is 64 bits (see model.rs)
            uneven_pipeline: A::UNEVEN_PIPELINE,
            ..opts.clone()
        }
    }

    fn load_with(dir: &Path, opts: &LoadOptions, parallel: Parallel) -> Result<Self> {
        let config = Config::from_file(dir.join("config.json"))?;
        check_agrees::<A>(dir, &config)?;
        let model = Model::load_with_config(dir, &config, &Self::options(opts), parallel)?;
        Ok(Declared { model, _arch: PhantomData })
    }
}

/// Checks a checkpoint's config.json against a declaration, naming the first field that
/// differs.
pub fn check_agrees<A: Architecture>(dir: &Path, c: &Config) -> Result<()> {
    let declared = A::config();
    let mismatch = |field: &'static str, checkpoint: String, declared: String| Error::ConfigMismatch {
        dir: dir.to_owned(),
        arch: A::NAME,
        field,
        checkpoint,
        declared,
    };
    if c.family != declared.family {
        return Err(mismatch("model_type", c.family.model_type().into(), declared.family.model_type().into()));
    }
    for f in headcount_spec::FIELDS.iter().filter(|f| f.in_family(c.family)) {
        let (got, want) = if f.key == headcount_spec::keys::HEAD_DIM {
            let show = |d: Option<u64>| d.map_or(FieldValue::Absent, FieldValue::Int);
            (show(c.resolved_head_dim()), show(declared.resolved_head_dim()))
        } else {
            (c.get(f.key).unwrap_or(FieldValue::Absent), declared.get(f.key).unwrap_or(FieldValue::Absent))
        };
        if got != want {
            return Err(mismatch(f.key, got.to_string(), want.to_string()));
        }
    }
    Ok(())
}
