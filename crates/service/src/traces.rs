//! Traces over OTLP/HTTP (protobuf), when `telemetry.otlp_endpoint` is set. Each service holds a [`Tracer`]; when
//! tracing is off it is empty, and every call on it is one branch on `None`: no span, no context parsing, no
//! allocation on the delivery path. The spans are made with explicit attributes (not from log spans), one per
//! step an SRE follows: fan-out, attempt (one per try), retry hold, held release, dead letter.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hookline_core::model::{DeadLetter, DeliveryTask, Event};
use hookline_core::trace::{TraceParent, MAX_TRACESTATE_LEN};
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::config::TelemetrySettings;

/// A service's tracer. `Tracer::default()` is off.
#[derive(Clone, Default, Debug)]
pub struct Tracer(Option<On>);

#[derive(Clone, Debug)]
struct On {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
}

/// One span in progress; ended (and exported) when dropped if not ended before. Boxed, so that an `Option<Span>`
/// kept in a delivery's future is one word when tracing is off.
pub struct Span(Box<opentelemetry_sdk::trace::Span>);

impl Tracer {
    /// The tracer of `component` (`ingest`, `dispatcher`, `retry-scheduler`): off unless `otlp_endpoint` is set.
    /// Services of one process (dev mode, tests) with the same telemetry settings share one exporter.
    pub fn new(settings: &TelemetrySettings, component: &'static str) -> Tracer {
        let Some(endpoint) = &settings.otlp_endpoint else { return Tracer(None) };
        let Some(provider) = provider(settings, endpoint) else { return Tracer(None) };
        let scope = InstrumentationScope::builder(format!("hookline-{component}")).with_version(env!("CARGO_PKG_VERSION")).build();
        Tracer(Some(On { tracer: provider.tracer_with_scope(scope), provider }))
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Sends the finished spans now (at shutdown, so the last ones are not lost).
    pub async fn flush(&self) {
        if let Some(on) = &self.0 {
            let provider = on.provider.clone();
            let _ = tokio::task::spawn_blocking(move || provider.force_flush()).await;
        }
    }

    /// Ingest: the fan-out span of one event. Its parent is the first valid of `record_traceparent` (the Kafka
    /// header or the HTTP header) and the event's own field; with none, a new trace starts here. The event's trace
    /// fields are replaced by the span's context, so every delivery of it continues the trace; when tracing is off
    /// they are cleared (what reaches internal topics is only ever hookline's own formatting).
    pub fn fanout(&self, event: &mut Event, record_traceparent: Option<&[u8]>, record_tracestate: Option<&[u8]>) -> Option<Span> {
        let Some(on) = &self.0 else {
            if !event.traceparent.is_empty() || !event.tracestate.is_empty() {
                event.traceparent.clear();
                event.tracestate.clear();
            }
            return None;
        };
        let from_record = record_traceparent
            .and_then(|tp| std::str::from_utf8(tp).ok())
            .and_then(|tp| remote_context(tp, record_tracestate.and_then(|ts| std::str::from_utf8(ts).ok()).unwrap_or("")));
        let parent = from_record.or_else(|| remote_context(&event.traceparent, &event.tracestate)).unwrap_or_default();
        let span = on
            .tracer
            .span_builder("hookline.fanout")
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("hookline.event.id", event.id.clone()),
                KeyValue::new("hookline.event.type", event.r#type.clone()),
            ])
            .start_with_context(&on.tracer, &parent);
        let mut span = span;
        if !event.tenant.is_empty() {
            span.set_attribute(KeyValue::new("hookline.tenant", event.tenant.clone()));
        }
        let span = Span(Box::new(span));
        let (tp, ts) = span.headers();
        event.traceparent = tp;
        event.tracestate = ts;
        Some(span)
    }

    /// Ingest API: the trace context of `POST /v1/events` put on the event (validated, reformatted), or cleared.
    pub fn accept_http(&self, event: &mut Event, traceparent: Option<&[u8]>, tracestate: Option<&[u8]>) {
        event.traceparent.clear();
        event.tracestate.clear();
        if self.0.is_none() {
            return;
        }
        let Some(tp) = traceparent.and_then(|v| std::str::from_utf8(v).ok()).and_then(TraceParent::parse) else {
            return;
        };
        event.traceparent = tp.to_string();
        if let Some(ts) = tracestate.and_then(|v| std::str::from_utf8(v).ok()).and_then(valid_tracestate) {
            event.tracestate = ts.header();
        }
    }

    /// Dispatcher: the span of one try of `task`, child of the event's context. Its context goes out as the
    /// request's `traceparent` (see [`Span::headers`]); [`Span::finish_attempt`] records how it ended.
    pub fn attempt(&self, task: &DeliveryTask, attempt: u32, try_no: u32) -> Option<Span> {
        let on = self.0.as_ref()?;
        let parent = parent_of(task.event.as_ref());
        let span = on
            .tracer
            .span_builder("hookline.attempt")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("hookline.delivery.id", task.delivery_id.clone()),
                KeyValue::new("hookline.subscription.id", task.subscription_id.clone()),
                KeyValue::new("hookline.attempt", i64::from(attempt)),
                KeyValue::new("hookline.try", i64::from(try_no)),
            ])
            .start_with_context(&on.tracer, &parent);
        Some(Span(Box::new(span)))
    }

    /// Retry-scheduler: a task's wait on a tier, from when it was enqueued until now (its release), as one span.
    /// `route` is where it went: `deliveries` or the next tier's name.
    pub fn retry_hold(&self, task: &DeliveryTask, enqueued_at_ms: i64, tier_delay_ms: i64, route: &str, now_ms: i64) {
        let Some(on) = &self.0 else { return };
        let mut span = on
            .tracer
            .span_builder("hookline.retry.hold")
            .with_kind(SpanKind::Internal)
            .with_start_time(at(enqueued_at_ms))
            .with_attributes([
                KeyValue::new("hookline.delivery.id", task.delivery_id.clone()),
                KeyValue::new("hookline.subscription.id", task.subscription_id.clone()),
                KeyValue::new("hookline.attempts_made", i64::from(task.attempts_made)),
                KeyValue::new("hookline.retry.tier_delay_ms", tier_delay_ms),
                KeyValue::new("hookline.retry.due_at_ms", task.due_at_ms),
                KeyValue::new("hookline.retry.lateness_ms", now_ms.saturating_sub(task.due_at_ms)),
                KeyValue::new("hookline.retry.route", route.to_owned()),
            ])
            .start_with_context(&on.tracer, &parent_of(task.event.as_ref()));
        span.end_with_timestamp(at(now_ms));
    }

    /// Retry-scheduler: a held task (inactive subscription) released to `deliveries`.
    pub fn held_release(&self, task: &DeliveryTask) {
        let Some(on) = &self.0 else { return };
        let mut span = on
            .tracer
            .span_builder("hookline.held.release")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("hookline.delivery.id", task.delivery_id.clone()),
                KeyValue::new("hookline.subscription.id", task.subscription_id.clone()),
            ])
            .start_with_context(&on.tracer, &parent_of(task.event.as_ref()));
        span.end();
    }

    /// A dead letter written for a delivery: child of `parent` (the last attempt's span) or else of the event's
    /// context.
    pub fn dead_letter(&self, dl: &DeadLetter, parent: Option<&Span>) {
        let Some(on) = &self.0 else { return };
        let cx = match parent {
            Some(p) => Context::new().with_remote_span_context(p.0.span_context().clone()),
            None => parent_of(dl.event.as_ref()),
        };
        dead_letter_span(on, dl, &cx);
    }

    /// Ingest: a malformed event dead-lettered, in the publisher's trace when its record had a valid
    /// `traceparent` header (none: no span, there is nothing to follow).
    pub fn dead_letter_of_record(&self, dl: &DeadLetter, record_traceparent: Option<&[u8]>, record_tracestate: Option<&[u8]>) {
        let Some(on) = &self.0 else { return };
        let tp = record_traceparent.and_then(|v| std::str::from_utf8(v).ok()).unwrap_or("");
        let ts = record_tracestate.and_then(|v| std::str::from_utf8(v).ok()).unwrap_or("");
        if let Some(cx) = remote_context(tp, ts) {
            dead_letter_span(on, dl, &cx);
        }
    }
}

fn dead_letter_span(on: &On, dl: &DeadLetter, cx: &Context) {
    let mut span = on
        .tracer
        .span_builder("hookline.dead_letter")
        .with_kind(SpanKind::Producer)
        .with_attributes([
            KeyValue::new("hookline.dead_letter.reason", dl.reason.clone()),
            KeyValue::new("hookline.delivery.id", dl.delivery_id.clone()),
            KeyValue::new("hookline.subscription.id", dl.subscription_id.clone()),
            KeyValue::new("hookline.final_state", dl.final_state.clone()),
            KeyValue::new("hookline.attempts", i64::from(dl.attempts)),
            KeyValue::new("hookline.last_outcome", dl.last_outcome.clone()),
        ])
        .start_with_context(&on.tracer, cx);
    span.set_status(Status::error(dl.reason.clone()));
    span.end();
}

impl Span {
    /// `traceparent` and `tracestate` (possibly empty) naming this span as the parent.
    pub fn headers(&self) -> (String, String) {
        let sc = self.0.span_context();
        let tp = TraceParent { trace_id: sc.trace_id().to_bytes(), span_id: sc.span_id().to_bytes(), flags: sc.trace_flags().to_u8() };
        (tp.to_string(), sc.trace_state().header())
    }

    pub fn set_i64(&mut self, key: &'static str, value: i64) {
        self.0.set_attribute(KeyValue::new(key, value));
    }

    /// Ends an attempt span with what the attempt record says about it.
    pub fn finish_attempt(mut self, rec: &hookline_core::model::AttemptRecord) {
        let s = &mut *self.0;
        s.set_attribute(KeyValue::new("hookline.outcome", rec.outcome.clone()));
        if rec.http_status > 0 {
            s.set_attribute(KeyValue::new("http.response.status_code", i64::from(rec.http_status)));
        }
        s.set_attribute(KeyValue::new("hookline.verdict", rec.verdict.clone()));
        if rec.next_due_at_ms > 0 {
            s.set_attribute(KeyValue::new("hookline.next_due_at_ms", rec.next_due_at_ms));
        }
        if !rec.final_state.is_empty() {
            s.set_attribute(KeyValue::new("hookline.final_state", rec.final_state.clone()));
        }
        s.set_attribute(KeyValue::new("hookline.duration_ms", rec.duration_ms));
        if rec.verdict != "success" {
            s.set_status(Status::error(rec.reason.clone()));
        }
        s.end();
    }

    pub fn end(mut self) {
        self.0.end();
    }
}

/// The context a span of this event continues: the event's (validated) trace fields, or none (a new trace).
fn parent_of(event: Option<&Event>) -> Context {
    event.and_then(|e| remote_context(&e.traceparent, &e.tracestate)).unwrap_or_default()
}

fn remote_context(traceparent: &str, tracestate: &str) -> Option<Context> {
    if traceparent.is_empty() {
        return None;
    }
    let tp = TraceParent::parse(traceparent)?;
    let state = valid_tracestate(tracestate).unwrap_or_default();
    let sc = SpanContext::new(
        TraceId::from_bytes(tp.trace_id),
        SpanId::from_bytes(tp.span_id),
        TraceFlags::new(tp.flags & TraceFlags::SAMPLED.to_u8()),
        true,
        state,
    );
    Some(Context::new().with_remote_span_context(sc))
}

/// A `tracestate` within the W3C length limit whose members all parse; otherwise none (it is dropped, not the
/// trace).
fn valid_tracestate(value: &str) -> Option<TraceState> {
    if value.is_empty() || value.len() > MAX_TRACESTATE_LEN {
        return None;
    }
    TraceState::from_str(value).ok().filter(|s| !s.header().is_empty())
}

fn at(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// One exporter per distinct settings in the process (dev mode runs every service in one process).
fn provider(settings: &TelemetrySettings, endpoint: &str) -> Option<SdkTracerProvider> {
    static PROVIDERS: OnceLock<Mutex<HashMap<String, SdkTracerProvider>>> = OnceLock::new();
    let key = format!(
        "{endpoint} {} {} {} {}",
        settings.service_name, settings.sample_ratio, settings.export_interval_ms, settings.export_timeout_ms
    );
    let mut map = PROVIDERS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = map.get(&key) {
        return Some(p.clone());
    }
    let timeout = Duration::from_millis(settings.export_timeout_ms);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(ExportClient::new(timeout)?)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .with_timeout(timeout)
        .build();
    let exporter = match exporter {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "telemetry.otlp_endpoint: cannot build the OTLP exporter; tracing stays off");
            return None;
        }
    };
    let batch = BatchConfigBuilder::default().with_scheduled_delay(Duration::from_millis(settings.export_interval_ms)).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batch).build())
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio))))
        .with_resource(Resource::builder().with_service_name(settings.service_name.clone()).build())
        .build();
    tracing::info!(endpoint, service_name = %settings.service_name, "exporting traces over OTLP/HTTP");
    map.insert(key, provider.clone());
    Some(provider)
}

/// The exporter's HTTP client: hyper on a small runtime of its own. The SDK exports from its own thread, outside
/// any service's runtime, and a test's or service's runtime may stop while the process (and its spans) go on.
#[derive(Debug)]
struct ExportClient {
    runtime: tokio::runtime::Handle,
    client: hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

/// Largest collector answer read (it is a small protobuf status).
const MAX_RESPONSE_BYTES: usize = 64 << 10;

impl ExportClient {
    fn new(timeout: Duration) -> Option<Self> {
        static RUNTIME: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
        let runtime = RUNTIME.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("hookline-otlp")
                .enable_all()
                .build()
                .map_err(|e| tracing::error!(error = %e, "cannot start the OTLP export runtime"))
                .ok()
        });
        let runtime = runtime.as_ref()?.handle().clone();
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        Some(ExportClient { runtime, client, timeout })
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let timeout = self.timeout;
        let exchange = async move {
            let response = client.request(request.map(Full::new)).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_RESPONSE_BYTES).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        self.runtime
            .spawn(async move { tokio::time::timeout(timeout, exchange).await.map_err(|_| HttpError::from("OTLP export timed out"))? })
            .await
            .map_err(|e| HttpError::from(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_is_the_default_and_clears_what_came_in() {
        let t = Tracer::new(&TelemetrySettings::default(), "ingest");
        assert!(!t.is_on());
        let mut ev = Event { traceparent: "anything".into(), tracestate: "a=b".into(), ..Default::default() };
        assert!(t.fanout(&mut ev, Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), None).is_none());
        assert_eq!((ev.traceparent.as_str(), ev.tracestate.as_str()), ("", ""));
        t.accept_http(&mut ev, Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), None);
        assert_eq!(ev.traceparent, "", "nothing is parsed or carried when tracing is off");
        assert!(t.attempt(&DeliveryTask::default(), 1, 1).is_none());
    }

    #[test]
    fn a_tracestate_is_kept_only_when_valid() {
        assert_eq!(
            valid_tracestate("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7").map(|s| s.header()).as_deref(),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        );
        assert!(valid_tracestate("").is_none());
        assert!(valid_tracestate("no equals sign").is_none());
        assert!(valid_tracestate(&format!("a={}", "x".repeat(600))).is_none());
    }
}
