//! Per-subscription lanes: each subscription's deliveries run at most `cap` at a time, in the order they were
//! read from the partition; a slow or hanging endpoint fills only its own lane, so other subscriptions on the
//! same partition keep flowing. Waiting work is a queued closure that builds its future only when it runs, so a
//! deep backlog behind a hanging endpoint costs the task's own size, not a delivery's whole state machine.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use futures::future::BoxFuture;

/// What a job is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// A slot of its lane is free: do the work.
    Now,
    /// The job was shed from a stuck lane (see [`Lanes::shed`]): park the work elsewhere.
    Shed(Stuck),
}

/// Why a lane is judged stuck: the `cause` label of `hookline_deliveries_spilled_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StuckCause {
    /// It finished nothing for the whole threshold: its endpoint hangs (or is paused for longer).
    Stalled,
    /// It finishes work, but under 1/s or under a quarter of the mean pace of all lanes: its endpoint is slow,
    /// times out, or is rate-limited or paused, far below what the others manage.
    Slow,
    /// It keeps pace with the others but holds more than all other lanes together (`DEEP_SHARE`) and would need
    /// longer than `EXEMPT_DRAIN_FACTOR` times the threshold to finish it: one endpoint's burst taking up
    /// `max_in_flight` (a healthy lane parked shows up here, and a paused one that runs fast between pauses).
    Deep,
}

impl StuckCause {
    pub fn as_str(self) -> &'static str {
        match self {
            StuckCause::Stalled => "stalled",
            StuckCause::Slow => "slow",
            StuckCause::Deep => "deep",
        }
    }
}

/// A stuck lane: why, and how long it would need to drain at its pace (at least the threshold), i.e. about when
/// there is room in it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stuck {
    pub drain: Duration,
    pub cause: StuckCause,
}

/// Work for a lane: called with [`Run::Now`] when a slot is free, or with [`Run::Shed`] by whoever shed it.
pub type Job = Box<dyn FnOnce(Run) -> BoxFuture<'static, ()> + Send>;

struct Lane {
    running: usize,
    queue: VecDeque<Job>,
    /// When a job of this lane last finished (or the lane was created).
    last_done: Instant,
    /// The current pace window: when it started and how many jobs finished in it. A window closes at the first
    /// job that finishes at least `PACE_WINDOW` after it started.
    window_start: Instant,
    window_done: u32,
    /// Jobs finished per second, over the closed windows (each window weighs half of what came before).
    rate: Option<f64>,
    /// How long a job of this lane takes from start to finish, moving mean (`None` before the first finishes).
    job_secs: Option<f64>,
    /// The last slot handed to a parked task (see [`Lanes::paced_spill_wait`]).
    spill_cursor: Instant,
}

impl Lane {
    fn new(now: Instant) -> Self {
        Self {
            running: 0,
            queue: VecDeque::new(),
            last_done: now,
            window_start: now,
            window_done: 0,
            rate: None,
            job_secs: None,
            spill_cursor: now,
        }
    }

    fn finished(&mut self, now: Instant, took: Duration) {
        self.last_done = now;
        let t = took.as_secs_f64();
        self.job_secs = Some(self.job_secs.map_or(t, |prev| prev + (t - prev) * JOB_TIME_WEIGHT));
        self.window_done = self.window_done.saturating_add(1);
        let elapsed = now - self.window_start;
        if elapsed >= PACE_WINDOW {
            let r = f64::from(self.window_done) / elapsed.as_secs_f64();
            self.rate = Some(self.rate.map_or(r, |prev| (prev + r) / 2.0));
            self.window_start = now;
            self.window_done = 0;
        }
    }

    /// How long the lane would need to finish what it holds, at the pace it can finish jobs (see
    /// [`Lane::capacity`]); `None` while it is too young to tell.
    fn drain_time(&self, now: Instant, cap: usize) -> Option<Duration> {
        let depth = (self.running + self.queue.len()) as f64;
        let rate = self.capacity(now, cap)?;
        if rate <= 0.0 {
            return Some(Duration::MAX);
        }
        Some(Duration::from_secs_f64((depth / rate).min(1e9)))
    }

    /// Jobs per second the lane can finish: its pace, or, if more, `cap` jobs at a time at the time a job takes
    /// (Little's law). The pace alone says what the lane was *given*: one fed at 50/s by a partition the consumer
    /// reads behind the others finishes 50/s, however fast its endpoint is, and would look twenty seconds from
    /// drained at the first burst the consumer fetches for it. A hanging endpoint's jobs take their timeout, so
    /// there both say the same.
    fn capacity(&self, now: Instant, cap: usize) -> Option<f64> {
        let by_time = self.job_secs.filter(|t| *t > 0.0).map(|t| cap as f64 / t);
        match (self.pace(now), by_time) {
            (Some(p), Some(c)) => Some(p.max(c)),
            (p, None) => p,
            // A job finished, but no pace window closed yet: too young to tell, as before any job finished.
            (None, Some(_)) => None,
        }
    }

    /// Jobs finished per second lately; `None` while the lane is too young to tell.
    fn pace(&self, now: Instant) -> Option<f64> {
        let open = now - self.window_start;
        // The open window counts once it is long enough to mean something: jobs finished in it so far.
        let partial = (open >= PACE_WINDOW).then(|| f64::from(self.window_done) / open.as_secs_f64());
        match (self.rate, partial) {
            (Some(r), Some(p)) => Some((r + p) / 2.0),
            (Some(r), None) => Some(r),
            (None, Some(p)) => Some(p),
            (None, None) => None,
        }
    }
}

/// Below this pace (jobs per second) a lane's endpoint is taken to hang: its parked tasks follow the step ladder
/// instead of being paced.
const MIN_PACED_RATE: f64 = 1.0;
/// The longest a paced task is parked for.
const MAX_PACED_WAIT: Duration = Duration::from_secs(600);

/// A deep lane that can finish work at least this fraction of the mean pace of all lanes (and at least
/// `MIN_PACED_RATE`) is not judged stuck, however long it would need to drain (up to `EXEMPT_DRAIN_FACTOR` times the
/// threshold): its endpoint keeps up like the others, and it is deep because the consumer fetched far ahead on its
/// partition, or slow because the whole process or the broker is (every lane slows then). Parking such a lane's
/// tasks only delays healthy work and loads the retry ladder on the cores the deliveries need.
const RELATIVE_PACE: f64 = 0.25;
/// How many times the threshold a lane exempt by its relative pace may need to drain: bounds, in time, what one
/// endpoint holds of `dispatcher.max_in_flight` when it is the only busy one (then its pace is the mean). A bound in
/// time, not depth: a healthy lane 1,000–2,000 deep (the consumer fetched its partition ahead: the bench's window of
/// 8,000 over 18 lanes) drains in 3–8 s at a few hundred a second, and was parked by a bound of 4 × the depth.
const EXEMPT_DRAIN_FACTOR: u32 = 6;
/// The share of what all lanes hold that a lane exempt by its relative pace must exceed to be parked for its
/// drain time (`StuckCause::Deep`): more than all the others together. Drain times alone are not relative: when
/// the whole host stalls (load average 15–26 in the bench) every lane's pace falls together, and healthy lanes a few hundred
/// deep each needed over 30 s, so the bound parked them (5,869 `deep` spills in one bench run) and fed the retry
/// ladder on the cores the deliveries needed. A lane's share of the work does not move when all slow alike.
const DEEP_SHARE: f64 = 0.5;

/// The weight of the newest job in a lane's moving mean job time.
const JOB_TIME_WEIGHT: f64 = 0.125;

/// The shortest time a lane's pace is measured over. Jobs finish in bursts (a lane's tries wait on the same
/// produce acknowledgements, a loaded host stalls for tens of milliseconds): gaps between single completions say
/// little, a second of completions does.
const PACE_WINDOW: Duration = Duration::from_secs(1);

pub struct Lanes {
    cap: usize,
    lanes: Mutex<HashMap<String, Lane>>,
    /// Lanes whose cap adapts (policy `[concurrency]`): their current cap instead of `cap`. Locked before `lanes`
    /// when both are.
    caps: Mutex<HashMap<String, usize>>,
    /// Whether any lane has its own cap: until one does, no lock is taken for `caps` on the hot path.
    any_caps: AtomicBool,
    /// Every lane's completions together: only its pace is used (the process's jobs per second). Locked after
    /// `lanes`.
    all: Mutex<Lane>,
    /// Jobs running or queued in all lanes (the sum of their depths), changed under the `lanes` lock: read only
    /// when a lane is judged for `StuckCause::Deep`, so that judging takes no scan of the lanes.
    held: AtomicUsize,
}

impl Lanes {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            lanes: Mutex::new(HashMap::new()),
            caps: Mutex::new(HashMap::new()),
            any_caps: AtomicBool::new(false),
            all: Mutex::new(Lane::new(Instant::now())),
            held: AtomicUsize::new(0),
        })
    }

    /// `n` jobs left the lanes (finished or shed). Called under the `lanes` lock, as every change of `held` is.
    fn released(&self, n: usize) {
        self.held.store(self.held.load(Ordering::Relaxed).saturating_sub(n), Ordering::Relaxed);
    }

    fn cap_of(&self, key: &str) -> usize {
        if !self.any_caps.load(Ordering::Acquire) {
            return self.cap;
        }
        self.caps.lock().expect("lane caps lock").get(key).copied().unwrap_or(self.cap)
    }

    /// Sets `key`'s own cap (adaptive concurrency); a larger one starts queued jobs at once, a smaller one lets
    /// running jobs finish and starts no more until the lane is below it.
    pub fn set_cap(self: &Arc<Self>, key: &str, cap: usize) {
        let cap = cap.max(1);
        self.caps.lock().expect("lane caps lock").insert(key.to_owned(), cap);
        self.any_caps.store(true, Ordering::Release);
        let mut start = Vec::new();
        {
            let mut lanes = self.lanes.lock().expect("lanes lock");
            if let Some(lane) = lanes.get_mut(key) {
                while lane.running < cap {
                    let Some(job) = lane.queue.pop_front() else { break };
                    lane.running += 1;
                    start.push(job);
                }
            }
        }
        for job in start {
            self.run(key.to_owned(), job);
        }
    }

    /// Keeps the adaptive caps of subscriptions for which `live` holds; returns how many were forgotten. (Lanes
    /// themselves go when they empty.)
    pub fn retain_caps(&self, live: impl Fn(&str) -> bool) -> usize {
        let mut caps = self.caps.lock().expect("lane caps lock");
        let before = caps.len();
        caps.retain(|key, _| live(key));
        before - caps.len()
    }

    /// Runs `job` in `key`'s lane: now if the lane has room, otherwise after the jobs queued before it.
    pub fn submit(self: &Arc<Self>, key: &str, job: Job) {
        let cap = self.cap_of(key);
        {
            let mut lanes = self.lanes.lock().expect("lanes lock");
            let lane = match lanes.get_mut(key) {
                Some(l) => l,
                None => lanes.entry(key.to_owned()).or_insert_with(|| Lane::new(Instant::now())),
            };
            self.held.fetch_add(1, Ordering::Relaxed);
            if lane.running >= cap {
                lane.queue.push_back(job);
                return;
            }
            lane.running += 1;
        }
        self.run(key.to_owned(), job);
    }

    /// A lane's runner: runs `job`, then what its lane queued, while the lane is within its cap.
    fn run(self: &Arc<Self>, key: String, job: Job) {
        let lanes = self.clone();
        let runner = async move {
            let mut job = job;
            loop {
                let started = Instant::now();
                job(Run::Now).await;
                let cap = lanes.cap_of(&key);
                let mut all = lanes.lanes.lock().expect("lanes lock");
                let Some(lane) = all.get_mut(&key) else { return };
                let now = Instant::now();
                lane.finished(now, now - started);
                lanes.released(1);
                lanes.all.lock().expect("all lanes' pace lock").finished(now, now - started);
                // Over a cap that shrank meanwhile: this runner stops, the others go on.
                let next = if lane.running > cap { None } else { lane.queue.pop_front() };
                match next {
                    Some(next) => job = next,
                    None => {
                        lane.running -= 1;
                        if lane.running == 0 && lane.queue.is_empty() {
                            all.remove(&key);
                        }
                        return;
                    }
                }
            }
        };
        // Started where it is submitted (the consume loop): see `inline.rs`.
        crate::inline::spawn(runner);
    }

    /// Whether a lane holds at least `max_depth` jobs and would need longer than `drain` to finish them at the pace
    /// it can finish jobs (or has finished none for that long): its endpoint hangs or is far too slow for its load,
    /// so new work for it should wait elsewhere. A deep lane that drains quickly is just busy, and so is one that
    /// can finish work at a fair share of the mean pace of all lanes (see `RELATIVE_PACE`), unless it would need
    /// over `EXEMPT_DRAIN_FACTOR` times `drain` even so and holds more than all other lanes together
    /// (`DEEP_SHARE`).
    pub fn is_stuck(&self, key: &str, max_depth: usize, drain: Duration) -> bool {
        self.stuck_for(key, max_depth, drain).is_some()
    }

    /// Like [`Lanes::is_stuck`]; when stuck, why, and how long the lane would need to drain at its pace (at least
    /// `drain`): about when there is room in it again.
    pub fn stuck_for(&self, key: &str, max_depth: usize, drain: Duration) -> Option<Stuck> {
        let cap = self.cap_of(key);
        let lanes = self.lanes.lock().expect("lanes lock");
        let l = lanes.get(key)?;
        if l.running + l.queue.len() < max_depth {
            return None;
        }
        let now = Instant::now();
        let since = now - l.last_done;
        if since >= drain {
            return Some(Stuck { drain: since.max(l.drain_time(now, cap).unwrap_or(since)), cause: StuckCause::Stalled });
        }
        // The pace is measured over whole seconds (see `PACE_WINDOW`): a young lane is given that long, unless it
        // has finished nothing at all for `drain` (above).
        let needed = l.drain_time(now, cap)?.max(since);
        if needed < drain {
            return None;
        }
        let own = l.capacity(now, cap).unwrap_or(0.0);
        let all = self.all.lock().expect("all lanes' pace lock").pace(now);
        let keeps_pace = all.is_some_and(|all| own >= MIN_PACED_RATE && own >= all / lanes.len().max(1) as f64 * RELATIVE_PACE);
        if !keeps_pace {
            return Some(Stuck { drain: needed, cause: StuckCause::Slow });
        }
        if needed < drain.saturating_mul(EXEMPT_DRAIN_FACTOR) {
            return None;
        }
        // Keeping pace but long to drain: parked only if it alone holds most of the work (see `DEEP_SHARE`).
        let held = self.held.load(Ordering::Relaxed).max(1) as f64;
        if ((l.running + l.queue.len()) as f64) <= held * DEEP_SHARE {
            return None;
        }
        Some(Stuck { drain: needed, cause: StuckCause::Deep })
    }

    /// Takes the newest queued jobs of `key`'s lane until it holds at most `keep` (running included); the caller
    /// runs them with [`Run::Shed`]. For a stuck lane: what it queued before it was known to be stuck (its pace is
    /// measured over a second or more) would otherwise hold slots of `dispatcher.max_in_flight` for as long as the
    /// lane needs to drain.
    pub fn shed(&self, key: &str, keep: usize) -> Vec<Job> {
        let mut lanes = self.lanes.lock().expect("lanes lock");
        let Some(l) = lanes.get_mut(key) else { return Vec::new() };
        let excess = (l.running + l.queue.len()).saturating_sub(keep).min(l.queue.len());
        self.released(excess);
        let at = l.queue.len() - excess;
        l.queue.split_off(at).into()
    }

    /// For a lane that finishes work but holds more than it can finish soon: how long a task parked now should wait
    /// so that the lane has room for it when it comes back. Parked tasks get consecutive slots at the lane's pace
    /// after what it holds, so they return about as fast as it finishes work; all at once, they would make it too
    /// deep again and be parked again. `None` when the lane finishes (almost) nothing: its endpoint hangs, and the
    /// caller's step ladder applies.
    pub fn paced_spill_wait(&self, key: &str) -> Option<Duration> {
        let mut lanes = self.lanes.lock().expect("lanes lock");
        let l = lanes.get_mut(key)?;
        let now = Instant::now();
        let rate = l.pace(now).filter(|r| *r >= MIN_PACED_RATE)?;
        let drained = now + Duration::from_secs_f64((l.running + l.queue.len()) as f64 / rate);
        let slot = l.spill_cursor.max(drained) + Duration::from_secs_f64(1.0 / rate);
        l.spill_cursor = slot;
        Some((slot - now).min(MAX_PACED_WAIT))
    }

    /// Jobs running or waiting in a lane.
    pub fn depth(&self, key: &str) -> usize {
        self.lanes.lock().expect("lanes lock").get(key).map_or(0, |l| l.running + l.queue.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::{mpsc, oneshot};

    #[test]
    fn a_deleted_subscriptions_adaptive_cap_is_forgotten() {
        let lanes = Lanes::new(4);
        lanes.set_cap("deleted", 1);
        lanes.set_cap("live", 2);
        assert_eq!(lanes.retain_caps(|k| k == "live"), 1);
        assert_eq!(lanes.cap_of("deleted"), 4, "back to the default");
        assert_eq!(lanes.cap_of("live"), 2);
    }

    /// Jobs that count themselves running, until a shared signal lets them finish.
    fn counted(
        running: &Arc<std::sync::atomic::AtomicUsize>,
        peak: &Arc<std::sync::atomic::AtomicUsize>,
        go: &Arc<tokio::sync::Notify>,
    ) -> Job {
        let (running, peak, go) = (running.clone(), peak.clone(), go.clone());
        Box::new(move |_| {
            Box::pin(async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                go.notified().await;
                running.fetch_sub(1, Ordering::SeqCst);
            })
        })
    }

    #[tokio::test]
    async fn a_lane_follows_its_own_cap_as_it_shrinks_and_grows() {
        use std::sync::atomic::AtomicUsize;
        let lanes = Lanes::new(8);
        let (running, peak, go) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(tokio::sync::Notify::new()));
        lanes.set_cap("a", 2);
        for _ in 0..6 {
            lanes.submit("a", counted(&running, &peak, &go));
        }
        tokio::task::yield_now().await;
        assert_eq!(running.load(Ordering::SeqCst), 2, "its own cap, not the default 8");
        lanes.set_cap("a", 4);
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        assert_eq!(running.load(Ordering::SeqCst), 4, "a larger cap starts queued jobs at once");
        lanes.set_cap("a", 1);
        // Let jobs finish one wake-up at a time: the lane drains down to its new cap before starting more.
        for _ in 0..3 {
            go.notify_one();
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(running.load(Ordering::SeqCst), 1, "over a shrunk cap, finished runners stop");
        assert_eq!(peak.load(Ordering::SeqCst), 4);
        assert_eq!(lanes.depth("a"), 3, "one running, two queued");
    }

    #[tokio::test]
    async fn a_full_lane_queues_in_order_and_does_not_block_another() {
        let lanes = Lanes::new(1);
        let (order_tx, mut order_rx) = mpsc::unbounded_channel();
        let (release_tx, release_rx) = oneshot::channel::<()>();
        // "a" is held by a job that waits; two more queue behind it.
        let submit = |key: &str, job: BoxFuture<'static, ()>| lanes.submit(key, Box::new(move |_| job));
        let tx = order_tx.clone();
        submit(
            "a",
            Box::pin(async move {
                let _ = release_rx.await;
                tx.send("a1").unwrap();
            }),
        );
        for name in ["a2", "a3"] {
            let tx = order_tx.clone();
            submit("a", Box::pin(async move { tx.send(name).unwrap() }));
        }
        let tx = order_tx.clone();
        submit("b", Box::pin(async move { tx.send("b1").unwrap() }));
        let first = tokio::time::timeout(Duration::from_secs(1), order_rx.recv()).await.unwrap();
        assert_eq!(first, Some("b1"), "another lane runs while `a` is full");
        assert_eq!(lanes.depth("a"), 3);
        release_tx.send(()).unwrap();
        let mut rest = Vec::new();
        for _ in 0..3 {
            rest.push(order_rx.recv().await.unwrap());
        }
        assert_eq!(rest, ["a1", "a2", "a3"], "a lane keeps the order jobs were submitted in");
        tokio::task::yield_now().await;
        assert_eq!(lanes.depth("a"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deep_lane_is_stuck_when_it_cannot_drain_in_time() {
        let lanes = Lanes::new(1);
        let (first_tx, first_rx) = oneshot::channel::<()>();
        lanes.submit(
            "a",
            Box::new(move |_| {
                Box::pin(async move {
                    let _ = first_rx.await;
                })
            }),
        );
        lanes.submit("a", Box::new(|_| Box::pin(std::future::pending())));
        assert!(!lanes.is_stuck("a", 2, Duration::from_secs(1)), "deep, but only just started");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(lanes.is_stuck("a", 2, Duration::from_secs(1)), "deep and nothing finished for 2 s");
        assert!(!lanes.is_stuck("a", 3, Duration::from_secs(1)), "not at the depth");
        // The first job finishes after 2 s: at that pace the one left takes ~2 s more.
        first_tx.send(()).unwrap();
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert_eq!(lanes.depth("a"), 1);
        assert!(lanes.is_stuck("a", 1, Duration::from_secs(1)), "too slow to drain in 1 s");
        assert!(!lanes.is_stuck("a", 1, Duration::from_secs(3)), "drains within 3 s");
    }

    fn sleeper(ms: u64) -> Job {
        Box::new(move |_| Box::pin(tokio::time::sleep(Duration::from_millis(ms))))
    }

    #[tokio::test(start_paused = true)]
    async fn a_deep_lane_keeping_pace_with_the_others_is_not_stuck_and_a_far_slower_one_is() {
        let lanes = Lanes::new(1);
        // Healthy endpoints at 100 jobs/s; "deep" got far more of them (the consumer fetched ahead for it).
        for k in ["f0", "f1", "f2"] {
            for _ in 0..1_000 {
                lanes.submit(k, sleeper(10));
            }
        }
        for _ in 0..800 {
            lanes.submit("deep", sleeper(10));
        }
        // A slow endpoint: 5 jobs/s.
        for _ in 0..400 {
            lanes.submit("slow", sleeper(200));
        }
        tokio::time::sleep(Duration::from_millis(2_050)).await;
        let stuck = Duration::from_secs(5);
        assert!(lanes.depth("deep") > 500, "{}: ~6 s to drain at its pace", lanes.depth("deep"));
        assert!(!lanes.is_stuck("deep", 300, stuck), "it drains as fast as the others do");
        assert!(!lanes.is_stuck("f0", 300, stuck));
        assert!(lanes.is_stuck("slow", 300, stuck), "20 times slower than the others: its endpoint is the problem");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_deep_lane_is_exempt_by_its_pace_only_while_it_drains_within_six_times_the_threshold() {
        let lanes = Lanes::new(1);
        for _ in 0..1_300 {
            lanes.submit("solo", sleeper(10));
        }
        for _ in 0..3_500 {
            lanes.submit("huge", sleeper(10));
        }
        tokio::time::sleep(Duration::from_millis(2_050)).await;
        // Both at 100 jobs/s, each the mean: "solo" has ~1,095 left (~11 s), "huge" ~3,295 (~33 s).
        let stuck = Duration::from_secs(5);
        assert!(!lanes.is_stuck("solo", 250, stuck), "drains within 30 s at the others' pace");
        let s = lanes.stuck_for("huge", 250, stuck).expect("over 30 s to drain: it would hold too much of max_in_flight");
        assert_eq!(s.cause, StuckCause::Deep);
        assert!(s.drain > Duration::from_secs(30), "{s:?}");
    }

    /// When the whole host stalls every lane's pace falls together, and healthy lanes a few
    /// hundred deep each need over 30 s to drain at it. None of them is behind the others: none is parked.
    #[tokio::test(start_paused = true)]
    async fn a_host_wide_slowdown_parks_no_lane() {
        let lanes = Lanes::new(1);
        let keys: Vec<String> = (0..18).map(|i| format!("l{i}")).collect();
        // Endpoints that answer in 10 ms, on a host that makes every job take 10 times that: 10 jobs/s each.
        for (i, k) in keys.iter().enumerate() {
            for _ in 0..300 + 20 * i {
                lanes.submit(k, sleeper(100));
            }
        }
        tokio::time::sleep(Duration::from_millis(2_050)).await;
        let threshold = Duration::from_secs(5);
        let over_30_s = keys.iter().filter(|k| lanes.depth(k) > 300).count();
        assert!(over_30_s >= 12, "most lanes need over 6 × the threshold at 10 jobs/s: {over_30_s}");
        for k in &keys {
            assert_eq!(lanes.stuck_for(k, 256, threshold), None, "{k}: {} deep", lanes.depth(k));
        }
    }

    /// The same pace for all but one lane: the lane that alone is far slower still spills (`slow`), and so does one
    /// that keeps pace but alone holds more than all the others together and needs over 30 s (`deep`).
    #[tokio::test(start_paused = true)]
    async fn a_lane_alone_far_behind_the_others_still_parks() {
        let lanes = Lanes::new(1);
        let keys: Vec<String> = (0..16).map(|i| format!("l{i}")).collect();
        for k in &keys {
            for _ in 0..1_000 {
                lanes.submit(k, sleeper(10));
            }
        }
        for _ in 0..400 {
            lanes.submit("slower", sleeper(100));
        }
        for _ in 0..20_000 {
            lanes.submit("burst", sleeper(10));
        }
        tokio::time::sleep(Duration::from_millis(2_050)).await;
        let threshold = Duration::from_secs(5);
        for k in &keys {
            assert_eq!(lanes.stuck_for(k, 256, threshold), None, "{k}");
        }
        assert_eq!(lanes.stuck_for("slower", 256, threshold).map(|s| s.cause), Some(StuckCause::Slow), "10 times slower than the rest");
        let s = lanes.stuck_for("burst", 256, threshold).expect("it holds most of the work and needs minutes");
        assert_eq!(s.cause, StuckCause::Deep);
        assert!(s.drain > Duration::from_secs(150), "{s:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_sum_of_depths_follows_submits_finishes_and_sheds() {
        let lanes = Lanes::new(2);
        for _ in 0..5 {
            lanes.submit("a", sleeper(10));
            lanes.submit("b", Box::new(|_| Box::pin(std::future::pending())));
        }
        assert_eq!(lanes.held.load(Ordering::Relaxed), 10);
        assert_eq!(lanes.shed("b", 3).len(), 2);
        assert_eq!(lanes.held.load(Ordering::Relaxed), 8);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!((lanes.depth("a"), lanes.held.load(Ordering::Relaxed)), (0, 3), "a's five finished; b holds 3");
    }

    /// In the bench's run B a healthy lane 1,000–2,000 deep (the consumer fetched its partition
    /// ahead) needed 5–8 s at its pace and was parked once it held 4 × `max_queued_per_subscription`: ~950
    /// healthy deliveries round the retry ladder, the run's tail stretched and the isolation ratio fell to 0.8.
    #[tokio::test(start_paused = true)]
    async fn a_healthy_lane_far_deeper_than_the_others_is_not_parked_while_the_hanging_ones_are() {
        let lanes = Lanes::new(1);
        for k in ["f0", "f1", "f2"] {
            for _ in 0..1_000 {
                lanes.submit(k, sleeper(10));
            }
        }
        // Over 4 × 256 deep: ~13 s to drain at 100 jobs/s, like the others.
        for _ in 0..1_500 {
            lanes.submit("deep", sleeper(10));
        }
        // One endpoint times out every try after 2 s, one never answers.
        for _ in 0..300 {
            lanes.submit("timeout", sleeper(2_000));
            lanes.submit("hang", Box::new(|_| Box::pin(std::future::pending())));
        }
        tokio::time::sleep(Duration::from_millis(2_050)).await;
        let threshold = Duration::from_secs(5);
        assert!(lanes.depth("deep") > 1_024, "{}", lanes.depth("deep"));
        assert_eq!(lanes.stuck_for("deep", 256, threshold), None, "it drains as fast as the others");
        assert_eq!(lanes.stuck_for("f0", 256, threshold), None);
        assert_eq!(lanes.stuck_for("timeout", 256, threshold).map(|s| s.cause), Some(StuckCause::Slow), "0.5 jobs/s");
        assert_eq!(lanes.stuck_for("hang", 256, threshold).map(|s| s.cause), Some(StuckCause::Slow), "nothing finished yet");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(lanes.stuck_for("hang", 256, threshold).map(|s| s.cause), Some(StuckCause::Stalled), "nothing in 5 s");
        assert_eq!(lanes.stuck_for("deep", 256, threshold), None);
    }

    /// A lane fed slowly (its partition read behind the others) finishes only what it gets: its pace says nothing
    /// of its endpoint, which answers in 30 ms. When the consumer catches up and fetches a burst for it, it is
    /// judged by what it can finish (3 at a time, 100/s), not by the 50/s it was given.
    #[tokio::test(start_paused = true)]
    async fn a_lane_fed_slowly_is_judged_by_what_its_endpoint_can_do_when_a_burst_arrives() {
        let lanes = Lanes::new(3);
        for k in ["f0", "f1", "f2"] {
            for _ in 0..3_000 {
                lanes.submit(k, sleeper(10));
            }
        }
        // 50 a second, each 30 ms: one or two running, never empty.
        for _ in 0..150 {
            lanes.submit("fed", sleeper(30));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..1_000 {
            lanes.submit("fed", sleeper(30));
        }
        let threshold = Duration::from_secs(5);
        // 20 s at the 50/s it was fed, under a quarter of the mean (~240/s); 10 s at what it can do.
        assert_eq!(lanes.stuck_for("fed", 256, threshold), None);
        // A slow endpoint fed the same way is still found: 3 at a time, 1 s each.
        for _ in 0..400 {
            lanes.submit("slow", sleeper(1_000));
        }
        tokio::time::sleep(Duration::from_millis(2_050)).await;
        assert_eq!(lanes.stuck_for("slow", 256, threshold).map(|s| s.cause), Some(StuckCause::Slow));
        assert_eq!(lanes.stuck_for("fed", 256, threshold), None);
    }

    #[tokio::test]
    async fn shedding_takes_the_newest_queued_jobs_and_never_a_running_one() {
        let lanes = Lanes::new(2);
        let (tx, mut rx) = mpsc::unbounded_channel();
        for n in 0..6 {
            let tx = tx.clone();
            lanes.submit(
                "a",
                Box::new(move |run| {
                    Box::pin(async move {
                        if run == Run::Now {
                            std::future::pending::<()>().await;
                        }
                        tx.send((n, run)).unwrap();
                    })
                }),
            );
        }
        assert_eq!(lanes.depth("a"), 6);
        assert!(lanes.shed("a", 6).is_empty());
        let shed = lanes.shed("a", 3);
        assert_eq!(lanes.depth("a"), 3);
        let stuck = Stuck { drain: Duration::from_secs(9), cause: StuckCause::Slow };
        for job in shed {
            job(Run::Shed(stuck)).await;
        }
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(got, [(3, Run::Shed(stuck)), (4, Run::Shed(stuck)), (5, Run::Shed(stuck))]);
        assert_eq!(lanes.shed("a", 0).len(), 1, "the two running jobs stay");
        assert_eq!(lanes.depth("a"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn parked_tasks_of_a_progressing_lane_come_back_at_its_pace_and_a_hanging_lane_gets_none() {
        let lanes = Lanes::new(1);
        for _ in 0..50 {
            lanes.submit("slow", Box::new(|_| Box::pin(tokio::time::sleep(Duration::from_millis(100)))));
        }
        lanes.submit("hang", Box::new(|_| Box::pin(std::future::pending())));
        lanes.submit("hang", Box::new(|_| Box::pin(std::future::pending())));
        tokio::time::sleep(Duration::from_millis(2_050)).await;
        // ~10 jobs/s, ~30 left: room from ~3 s on, then one slot every ~100 ms.
        let waits: Vec<f64> = (0..3).map(|_| lanes.paced_spill_wait("slow").unwrap().as_secs_f64()).collect();
        assert!((2.8..3.5).contains(&waits[0]), "{waits:?}");
        for pair in waits.windows(2) {
            assert!((0.08..0.12).contains(&(pair[1] - pair[0])), "consecutive slots at the lane's pace: {waits:?}");
        }
        assert_eq!(lanes.paced_spill_wait("hang"), None, "a lane that finishes nothing follows the step ladder");
        assert_eq!(lanes.paced_spill_wait("unknown"), None);
    }
}
