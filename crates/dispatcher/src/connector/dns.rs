//! A bounded cache of host names' addresses in front of the resolver, so a named endpoint is not resolved on the
//! blocking pool (`getaddrinfo`) for every attempt and every new connection.
//!
//! It sits below the egress guard: the guard judges every address it returns, cached or fresh, on every precheck
//! and every connect. A cached answer is only ever what the resolver said within its lifetime; it is never a
//! verdict. Concurrent lookups of one name share one question. The system resolver reports no TTLs, so an answer
//! is kept for `egress.dns_cache_ttl_s`; a resolver that knows an answer's TTL ([`Resolve::resolve_with_ttl`])
//! shortens that to it. Failures are kept for `egress.dns_negative_ttl_s`.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use hookline_core::egress::EgressSettings;
use tokio::time::Instant;

use crate::connector::Resolve;

/// What a lookup answered, shareable between the questions that waited for it.
type Answer = Result<Arc<[IpAddr]>, (io::ErrorKind, Arc<str>)>;

enum Entry {
    Ready {
        answer: Answer,
        expires: Instant,
    },
    /// Being asked: later questions wait for the same answer.
    Asking(Shared<BoxFuture<'static, Answer>>),
}

struct Table {
    entries: HashMap<(String, u16), Entry>,
}

/// A [`Resolve`] that remembers answers: see the module doc.
pub struct CachingResolver {
    inner: Arc<dyn Resolve>,
    ttl: Duration,
    negative_ttl: Duration,
    max_entries: usize,
    table: Arc<Mutex<Table>>,
}

/// `resolver` behind a cache sized and timed by `settings`, or `resolver` itself when `egress.dns_cache_ttl_s`
/// is 0.
pub fn cached(resolver: Arc<dyn Resolve>, settings: &EgressSettings) -> Arc<dyn Resolve> {
    if settings.dns_cache_ttl_s == 0 {
        return resolver;
    }
    Arc::new(CachingResolver::new(
        resolver,
        Duration::from_secs(settings.dns_cache_ttl_s),
        Duration::from_secs(settings.dns_negative_ttl_s),
        settings.dns_cache_max_entries,
    ))
}

impl CachingResolver {
    pub fn new(inner: Arc<dyn Resolve>, ttl: Duration, negative_ttl: Duration, max_entries: usize) -> Self {
        Self { inner, ttl, negative_ttl, max_entries: max_entries.max(1), table: Arc::new(Mutex::new(Table { entries: HashMap::new() })) }
    }

    /// Names held (answers and lookups under way), for tests and the bench.
    pub fn len(&self) -> usize {
        self.table.lock().expect("dns cache lock").entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lookup(&self, host: &str, port: u16) -> BoxFuture<'static, Answer> {
        let key = (host.to_owned(), port);
        let mut table = self.table.lock().expect("dns cache lock");
        let now = Instant::now();
        match table.entries.get(&key) {
            Some(Entry::Ready { answer, expires }) if *expires > now => {
                metrics::counter!("hookline_dns_cache_total", "result" => "hit").increment(1);
                let answer = answer.clone();
                return Box::pin(async move { answer });
            }
            Some(Entry::Asking(shared)) => {
                metrics::counter!("hookline_dns_cache_total", "result" => "joined").increment(1);
                return shared.clone().boxed();
            }
            _ => {}
        }
        metrics::counter!("hookline_dns_cache_total", "result" => "miss").increment(1);
        if !table.entries.contains_key(&key) && table.entries.len() >= self.max_entries {
            make_room(&mut table.entries, now);
        }
        let asking = self.inner.resolve_with_ttl(host, port);
        let (ttl, negative_ttl) = (self.ttl, self.negative_ttl);
        // The lookup files its own answer, whoever polls it to the end: the question that started it may have
        // been dropped (its attempt timed out) while others still wait.
        let table_ref: Weak<Mutex<Table>> = Arc::downgrade(&self.table);
        let file_key = key.clone();
        let shared = async move {
            let (answer, keep): (Answer, Duration) = match asking.await {
                Ok((addrs, answer_ttl)) => (Ok(addrs.into()), answer_ttl.map_or(ttl, |t| t.min(ttl))),
                Err(e) => (Err((e.kind(), e.to_string().into())), negative_ttl),
            };
            if let Some(table) = table_ref.upgrade() {
                let mut table = table.lock().expect("dns cache lock");
                if keep.is_zero() {
                    table.entries.remove(&file_key);
                } else {
                    let expires = Instant::now() + keep;
                    table.entries.insert(file_key, Entry::Ready { answer: answer.clone(), expires });
                }
            }
            answer
        }
        .boxed()
        .shared();
        table.entries.insert(key, Entry::Asking(shared.clone()));
        shared.boxed()
    }
}

/// Drops every expired answer; if none was, the answer closest to expiring (lookups under way are kept: their
/// waiters file the answer).
fn make_room(entries: &mut HashMap<(String, u16), Entry>, now: Instant) {
    let before = entries.len();
    entries.retain(|_, e| !matches!(e, Entry::Ready { expires, .. } if *expires <= now));
    if entries.len() < before {
        return;
    }
    let soonest = entries
        .iter()
        .filter_map(|(k, e)| match e {
            Entry::Ready { expires, .. } => Some((*expires, k)),
            Entry::Asking(_) => None,
        })
        .min_by_key(|(expires, _)| *expires)
        .map(|(_, k)| k.clone());
    if let Some(k) = soonest {
        entries.remove(&k);
    }
}

impl Resolve for CachingResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        let answer = self.lookup(host, port);
        Box::pin(async move {
            match answer.await {
                Ok(addrs) => Ok(addrs.to_vec()),
                Err((kind, message)) => Err(io::Error::new(kind, message.to_string())),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers `addrs` (or fails when empty) after `delay`, counting questions; an optional TTL per answer.
    struct Counting {
        asked: AtomicUsize,
        addrs: Mutex<Vec<IpAddr>>,
        ttl: Option<Duration>,
        delay: Duration,
    }

    impl Counting {
        fn new(addrs: &[&str], ttl: Option<Duration>) -> Arc<Self> {
            Arc::new(Self {
                asked: AtomicUsize::new(0),
                addrs: Mutex::new(addrs.iter().map(|a| a.parse().unwrap()).collect()),
                ttl,
                delay: Duration::from_millis(10),
            })
        }
        fn asked(&self) -> usize {
            self.asked.load(Ordering::SeqCst)
        }
        fn answer_now(&self, addrs: &[&str]) {
            *self.addrs.lock().unwrap() = addrs.iter().map(|a| a.parse().unwrap()).collect();
        }
    }

    impl Resolve for Counting {
        fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
            let f = self.resolve_with_ttl(host, port);
            Box::pin(async move { f.await.map(|(a, _)| a) })
        }
        fn resolve_with_ttl(&self, host: &str, _port: u16) -> BoxFuture<'static, io::Result<(Vec<IpAddr>, Option<Duration>)>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let addrs = self.addrs.lock().unwrap().clone();
            let (ttl, delay, host) = (self.ttl, self.delay, host.to_owned());
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                if addrs.is_empty() {
                    Err(io::Error::new(io::ErrorKind::NotFound, format!("no such host {host}")))
                } else {
                    Ok((addrs, ttl))
                }
            })
        }
    }

    fn cache(inner: &Arc<Counting>, ttl_s: u64, negative_s: u64, max: usize) -> CachingResolver {
        CachingResolver::new(inner.clone(), Duration::from_secs(ttl_s), Duration::from_secs(negative_s), max)
    }

    fn ips(v: &[&str]) -> Vec<IpAddr> {
        v.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_kept_for_the_configured_ttl_then_asked_again() {
        let dns = Counting::new(&["93.184.216.34"], None);
        let c = cache(&dns, 30, 5, 100);
        assert_eq!(c.resolve("hooks.example.com", 443).await.unwrap(), ips(&["93.184.216.34"]));
        dns.answer_now(&["93.184.216.35"]);
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(c.resolve("hooks.example.com", 443).await.unwrap(), ips(&["93.184.216.34"]), "still fresh");
        assert_eq!(dns.asked(), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(c.resolve("hooks.example.com", 443).await.unwrap(), ips(&["93.184.216.35"]), "expired: asked again");
        assert_eq!(dns.asked(), 2);
        // Another name (or port) is its own entry.
        c.resolve("other.example.com", 443).await.unwrap();
        assert_eq!(dns.asked(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answers_own_shorter_ttl_is_honoured_and_a_longer_one_capped() {
        let dns = Counting::new(&["93.184.216.34"], Some(Duration::from_secs(3)));
        let c = cache(&dns, 30, 5, 100);
        c.resolve("short.example.com", 443).await.unwrap();
        tokio::time::advance(Duration::from_millis(2_900)).await;
        c.resolve("short.example.com", 443).await.unwrap();
        assert_eq!(dns.asked(), 1);
        tokio::time::advance(Duration::from_millis(200)).await;
        c.resolve("short.example.com", 443).await.unwrap();
        assert_eq!(dns.asked(), 2, "the answer's 3 s TTL, not the configured 30 s");

        let dns = Counting::new(&["93.184.216.34"], Some(Duration::from_secs(3_600)));
        let c = cache(&dns, 30, 5, 100);
        c.resolve("long.example.com", 443).await.unwrap();
        tokio::time::advance(Duration::from_secs(31)).await;
        c.resolve("long.example.com", 443).await.unwrap();
        assert_eq!(dns.asked(), 2, "an hour's TTL is capped at egress.dns_cache_ttl_s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_kept_briefly() {
        let dns = Counting::new(&[], None);
        let c = cache(&dns, 30, 5, 100);
        let e = c.resolve("gone.example.com", 443).await.unwrap_err();
        assert_eq!((e.kind(), e.to_string().as_str()), (io::ErrorKind::NotFound, "no such host gone.example.com"));
        dns.answer_now(&["93.184.216.34"]);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(c.resolve("gone.example.com", 443).await.unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(dns.asked(), 1);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(c.resolve("gone.example.com", 443).await.unwrap(), ips(&["93.184.216.34"]));
        assert_eq!(dns.asked(), 2);

        // A negative TTL of 0 remembers no failure.
        let dns = Counting::new(&[], None);
        let c = cache(&dns, 30, 0, 100);
        c.resolve("gone.example.com", 443).await.unwrap_err();
        c.resolve("gone.example.com", 443).await.unwrap_err();
        assert_eq!(dns.asked(), 2);
        assert!(c.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_questions_share_one_lookup_even_if_its_starter_gives_up() {
        let dns = Counting::new(&["93.184.216.34"], None);
        let c = cache(&dns, 30, 5, 100);
        let first = c.resolve("hooks.example.com", 443);
        let waiters: Vec<_> = (0..50).map(|_| c.resolve("hooks.example.com", 443)).collect();
        // The question that started the lookup is dropped before it was answered (say its attempt timed out).
        drop(first);
        for w in futures::future::join_all(waiters).await {
            assert_eq!(w.unwrap(), ips(&["93.184.216.34"]));
        }
        assert_eq!(dns.asked(), 1);
        c.resolve("hooks.example.com", 443).await.unwrap();
        assert_eq!(dns.asked(), 1, "the answer was filed by whoever finished the lookup");
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_is_capped_dropping_expired_answers_first_then_the_soonest_to_expire() {
        let dns = Counting::new(&["93.184.216.34"], None);
        let c = cache(&dns, 30, 5, 3);
        for name in ["a.example", "b.example", "c.example"] {
            c.resolve(name, 443).await.unwrap();
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        c.resolve("d.example", 443).await.unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(dns.asked(), 4);
        c.resolve("b.example", 443).await.unwrap();
        c.resolve("c.example", 443).await.unwrap();
        assert_eq!(dns.asked(), 4, "b and c kept");
        c.resolve("a.example", 443).await.unwrap();
        assert_eq!(dns.asked(), 5, "a, the soonest to expire, was the one dropped");
        // All expired: a new name clears them, not just one.
        tokio::time::advance(Duration::from_secs(31)).await;
        c.resolve("e.example", 443).await.unwrap();
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn a_zero_ttl_turns_the_cache_off() {
        let dns: Arc<dyn Resolve> = Counting::new(&["93.184.216.34"], None);
        let off = cached(dns.clone(), &EgressSettings { dns_cache_ttl_s: 0, ..Default::default() });
        assert!(Arc::ptr_eq(&off, &dns));
        let on = cached(dns.clone(), &EgressSettings::default());
        assert!(!Arc::ptr_eq(&on, &dns));
    }
}
