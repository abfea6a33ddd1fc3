//! Step 3 of a master-key rotation: every subscription whose signing secrets are sealed with another key than
//! `secrets.write_key` (or stored in the clear by an older version) is written again, sealed with the write key, so
//! the old key can then be removed. Admin only; safe to repeat (a second call finds nothing to do).

use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use serde_json::{json, Value};

use crate::auth::Principal;
use crate::{subscriptions, ApiError, ApiState};

pub async fn reseal(State(s): State<Arc<ApiState>>, Extension(who): Extension<Principal>) -> Result<Json<Value>, ApiError> {
    who.require_admin()?;
    let stale: Vec<String> = s.subs.all().iter().filter(|e| e.sub.needs_reseal(&s.keyring)).map(|e| e.sub.id.to_string()).collect();
    let mut resealed = 0u64;
    for id in stale {
        // Read again just before writing: the newest version is the one written (a PATCH may have landed), and
        // one a PATCH already re-sealed is skipped.
        let Some(entry) = s.subs.get(&id) else { continue };
        if !entry.sub.needs_reseal(&s.keyring) {
            continue;
        }
        subscriptions::write(&s, &entry.sub.to_subscription()).await?;
        resealed += 1;
    }
    let remaining = s.subs.all().iter().filter(|e| e.sub.needs_reseal(&s.keyring)).count();
    Ok(Json(json!({"resealed": resealed, "remaining": remaining, "write_key": s.keyring.write_key_id()})))
}
