//! The ranks of a run: the torchrun environment a rank starts from, and the groups it joins.
//!
//! World = tensor-parallel size x pipeline size; global rank = stage x tp + tp rank (the
//! tensor-parallel ranks of a stage are neighbours, as in Megatron-LM). Each stage's ranks
//! form a tensor-parallel group; the world group carries the hidden states from stage to
//! stage and the logits from the last stage to every rank.

use std::time::Duration;

use super::group::{Bind, ProcessGroup, Store};
use crate::error::{Error, Result};

/// How long any one wait on another rank may take by default (a rendezvous, a collective,
/// a send or receive); a rank that dies is noticed at once, one that hangs within this.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long ranks wait for each other to finish loading their weights by default.
pub const DEFAULT_LOAD_TIMEOUT: Duration = Duration::from_secs(1800);

/// The environment torchrun gives each rank (and headcount's own launcher gives its ranks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// `TORCHELASTIC_USE_AGENT_STORE=True`: torchrun's agent serves the store, every rank is
    /// a client.
    pub agent_store: bool,
    /// `TORCHELASTIC_RESTART_COUNT`: keys of an earlier attempt are not read again.
    pub restart: u64,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value.trim().parse().map_err(|_| Error::Parallel(format!("{name}={value:?} is not a number")))
}

impl RankEnv {
    /// The rank this process is, from `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`; `None` when `RANK` and
    /// `WORLD_SIZE` are both unset (a process that is not a rank).
    pub fn from_env() -> Result<Option<RankEnv>> {
        let (rank, world) = match (var("RANK"), var("WORLD_SIZE")) {
            (None, None) => return Ok(None),
            (Some(r), Some(w)) => (number::<usize>("RANK", &r)?, number::<usize>("WORLD_SIZE", &w)?),
            (Some(_), None) => return Err(Error::Parallel("RANK is set but WORLD_SIZE is not".to_owned())),
            (None, Some(_)) => return Err(Error::Parallel("WORLD_SIZE is set but RANK is not".to_owned())),
        };
        if world == 0 || rank >= world {
            return Err(Error::Parallel(format!("RANK={rank} must be below WORLD_SIZE={world}")));
        }
        let local_rank = var("LOCAL_RANK").map(|v| number("LOCAL_RANK", &v)).transpose()?.unwrap_or(rank);
        let local_world_size =
            var("LOCAL_WORLD_SIZE").map(|v| number("LOCAL_WORLD_SIZE", &v)).transpose()?.unwrap_or(world);
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".to_owned());
        let port: u32 = var("MASTER_PORT").map(|v| number("MASTER_PORT", &v)).transpose()?.unwrap_or(29500);
        let master_port = u16::try_from(port)
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| Error::Parallel(format!("MASTER_PORT={port} is not a TCP port (1-65535)")))?;
        let agent_store = var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let restart =
            var("TORCHELASTIC_RESTART_COUNT").map(|v| number("TORCHELASTIC_RESTART_COUNT", &v)).transpose()?;
        Ok(Some(RankEnv {
            rank,
            world_size: world,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            agent_store,
            restart: restart.unwrap_or(0),
        }))
    }

    /// The variables that make a process this rank.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RANK", self.rank.to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_RANK", self.local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", self.local_world_size.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
        ]
    }
}

/// Timeouts of a parallel run.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Any one wait on another rank.
    pub wait: Duration,
    /// Waiting for every rank to load its weights.
    pub load: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { wait: DEFAULT_TIMEOUT, load: DEFAULT_LOAD_TIMEOUT }
    }
}

/// This process's place in a run of `tp x pp` ranks, and the groups it communicates in.
pub struct Parallel {
    pub tp: usize,
    pub pp: usize,
    /// The global rank.
    pub rank: usize,
    pub tp_rank: usize,
    pub stage: usize,
    pub local_rank: usize,
    /// Ranks on this machine (LOCAL_WORLD_SIZE): they share its memory.
    pub local_size: usize,
    /// The ranks of this stage.
    pub tp_group: ProcessGroup,
    /// Every rank.
    pub world: ProcessGroup,
    store: Option<Store>,
    prefix: String,
    timeouts: Timeouts,
    /// Store exchanges made so far: every rank makes the same sequence, so the count names
    /// each exchange's keys and a later one never reads an earlier one's values.
    exchanges: std::cell::Cell<u64>,
}

impl std::fmt::Debug for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rank {} of {} (tp {} rank {}, stage {} of {})",
            self.rank,
            self.size(),
            self.tp,
            self.tp_rank,
            self.stage,
            self.pp
        )
    }
}

impl Parallel {
    /// One rank that is the whole run.
    pub fn single() -> Parallel {
        Parallel {
            tp: 1,
            pp: 1,
            rank: 0,
            tp_rank: 0,
            stage: 0,
            local_rank: 0,
            local_size: 1,
            tp_group: ProcessGroup::single(),
            world: ProcessGroup::single(),
            store: None,
            prefix: String::new(),
            timeouts: Timeouts::default(),
            exchanges: Default::default(),
        }
    }

    /// Joins the run `env` describes as one of `tp x pp` ranks: meets the others at the store,
    /// then joins the world group and this stage's tensor-parallel group.
    pub fn join(env: &RankEnv, tp: usize, pp: usize, timeouts: Timeouts) -> Result<Parallel> {
        if tp == 0 || pp == 0 {
            return Err(Error::Parallel(format!("--tp {tp} --pp {pp}: both must be at least 1")));
        }
        if tp.checked_mul(pp) != Some(env.world_size) {
            return Err(Error::Parallel(format!(
                "WORLD_SIZE is {} but --tp {tp} x --pp {pp} makes {} ranks: start tp x pp ranks",
                env.world_size,
                tp.saturating_mul(pp)
            )));
        }
        let (rank, world) = (env.rank, env.world_size);
        let server = rank == 0 && !env.agent_store;
        let store = Store::connect(&env.master_addr, env.master_port, server, world, timeouts.wait)?;
        let prefix = format!("headcount/{}/", env.restart);
        let bind = bind_for(&env.master_addr);
        let (stage, tp_rank) = (rank / tp, rank % tp);
        let w = timeouts.wait;
        let world_group =
            ProcessGroup::new(&store, &format!("{prefix}world/"), "world group", rank, world, rank, w, &bind)?;
        let tp_name = format!("tensor-parallel group of stage {stage}");
        let tp_group =
            ProcessGroup::new(&store, &format!("{prefix}tp{stage}/"), &tp_name, tp_rank, tp, rank, w, &bind)?;
        Ok(Parallel {
            tp,
            pp,
            rank,
            tp_rank,
            stage,
            local_rank: env.local_rank,
            local_size: env.local_world_size.max(1),
            tp_group,
            world: world_group,
            store: Some(store),
            prefix,
            timeouts,
            exchanges: Default::default(),
        })
    }

    /// Time spent in collectives of this rank's groups so far.
    pub fn comm_time(&self) -> Duration {
        self.tp_group.spent().0 + self.world.spent().0
    }

    /// Ranks in the run.
    pub fn size(&self) -> usize {
        self.tp * self.pp
    }

    pub fn is_first_stage(&self) -> bool {
        self.stage == 0
    }

    pub fn is_last_stage(&self) -> bool {
        self.stage + 1 == self.pp
    }

    /// The global rank of this tensor-parallel rank in stage `stage`.
    pub fn rank_in_stage(&self, stage: usize) -> usize {
        stage * self.tp + self.tp_rank
    }

    /// The rank whose logits every rank receives: the last stage's first.
    pub fn logits_root(&self) -> usize {
        (self.pp - 1) * self.tp
    }

    /// Checks that every rank was given the same `fields` (name, value) under `label` (one
    /// label per check): each rank
    /// publishes its own and compares every other's; a difference is an error on every
    /// rank naming the field and both values.
    pub fn agree(&self, label: &str, fields: &[(&str, String)]) -> Result<()> {
        let Some(store) = &self.store else { return Ok(()) };
        let n = self.next_exchange();
        let mine = serde_json::to_vec(&fields.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<Vec<_>>())
            .map_err(|e| Error::Parallel(format!("could not encode this rank's options: {e}")))?;
        store.set(&format!("{}{n}/{label}/{}", self.prefix, self.rank), &mine)?;
        for other in (0..self.size()).filter(|&r| r != self.rank) {
            let key = format!("{}{n}/{label}/{other}", self.prefix);
            let theirs = store.get(&key, self.timeouts.wait).map_err(|e| {
                Error::Parallel(format!(
                    "rank {}: rank {other} did not publish its options (waited up to {} s): {e}",
                    self.rank,
                    self.timeouts.wait.as_secs()
                ))
            })?;
            let theirs: Vec<(String, String)> = serde_json::from_slice(&theirs)
                .map_err(|_| Error::Parallel(format!("rank {other} published options this rank cannot read")))?;
            for (name, value) in fields {
                let their = theirs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
                if their != Some(value.as_str()) {
                    return Err(Error::Parallel(format!(
                        "ranks disagree on {name}: rank {} has {value:?}, rank {other} has {}; every rank must be started with the same model and options",
                        self.rank,
                        their.map_or("nothing".to_owned(), |t| format!("{t:?}")),
                    )));
                }
            }
        }
        Ok(())
    }

    /// Waits until every rank has loaded its weights (up to the load timeout), so that the
    /// first collective, bounded by the shorter wait timeout, does not wait on a slow loader.
    pub fn loaded(&self) -> Result<()> {
        let Some(store) = &self.store else { return Ok(()) };
        let n = self.next_exchange();
        store.set(&format!("{}{n}/loaded/{}", self.prefix, self.rank), b"1")?;
        for other in (0..self.size()).filter(|&r| r != self.rank) {
            store.get(&format!("{}{n}/loaded/{other}", self.prefix), self.timeouts.load).map_err(|e| {
                Error::Parallel(format!(
                    "rank {}: rank {other} did not finish loading within {} s ({e})",
                    self.rank,
                    self.timeouts.load.as_secs()
                ))
            })?;
        }
        Ok(())
    }
}

impl Parallel {
    fn next_exchange(&self) -> u64 {
        let n = self.exchanges.get();
        self.exchanges.set(n + 1);
        n
    }
}

/// Where Gloo's connections bind: `GLOO_SOCKET_IFNAME`'s interfaces, else loopback for a
/// loopback `MASTER_ADDR` (a run on one machine), else the hostname's address.
fn bind_for(master_addr: &str) -> Bind {
    if let Some(interfaces) = var("GLOO_SOCKET_IFNAME") {
        return Bind { interfaces, hostname: String::new() };
    }
    let loopback = matches!(master_addr, "127.0.0.1" | "localhost" | "::1")
        || master_addr.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback());
    Bind { interfaces: String::new(), hostname: if loopback { "127.0.0.1".to_owned() } else { String::new() } }
}
