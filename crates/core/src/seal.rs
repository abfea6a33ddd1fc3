//! Signing secrets and custom header values at rest: AES-256-GCM under a master key named by an id. A keyring
//! holds every key that may open a record (old ones during a rotation) and names the one new records are sealed
//! with. The subscription id (and a header's name) is the associated data, so a sealed value moved into another
//! subscription's record, or under another header, does not open.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;

use crate::model::{SealedHeader, Subscription};

pub const KEY_BYTES: usize = 32;
const NONCE_BYTES: usize = 12;
/// Longest key id: it is stored with every secret.
pub const MAX_KEY_ID_LEN: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The record names a key this process was not given.
    #[error("sealed with key {key_id:?}, which is not among the configured keys ({known}); add it to secrets.keys")]
    UnknownKey { key_id: String, known: String },
    /// The key is known but the record does not open with it: another key under the same id, or a damaged record.
    #[error("does not open with key {key_id:?} (a different key under that id, or a damaged record)")]
    WrongKey { key_id: String },
    #[error("invalid key entry: {0}")]
    InvalidEntry(String),
    #[error("secrets.write_key: {0:?} is not among the configured keys")]
    UnknownWriteKey(String),
    #[error("no master key configured (secrets.keys or secrets.keys_file)")]
    NoKeys,
}

/// The master keys. `Debug` shows only their ids.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<(String, Aes256Gcm)>,
    write: usize,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring").field("ids", &self.ids()).field("write", &self.write_key_id()).finish()
    }
}

/// Parses one key entry, `<id>:<base64 of 32 bytes>`.
pub fn parse_entry(entry: &str) -> Result<(String, [u8; KEY_BYTES]), SealError> {
    let invalid = |m: String| Err(SealError::InvalidEntry(m));
    let Some((id, b64)) = entry.trim().split_once(':') else {
        return invalid("expected `<id>:<base64 of 32 bytes>` (make one with `hookline secrets generate-key`)".into());
    };
    if id.is_empty() || id.len() > MAX_KEY_ID_LEN || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return invalid(format!("key id {id:?}: 1 to {MAX_KEY_ID_LEN} ASCII letters, digits, `-`, `_` or `.`"));
    }
    // The error of the decoder is not shown: it could quote part of the key.
    let bytes = B64.decode(b64.trim()).map_err(|_| SealError::InvalidEntry(format!("key {id:?}: not valid base64")))?;
    let key: [u8; KEY_BYTES] =
        bytes.try_into().map_err(|b: Vec<u8>| SealError::InvalidEntry(format!("key {id:?}: {} bytes, expected {KEY_BYTES}", b.len())))?;
    Ok((id.to_owned(), key))
}

/// A new key entry for `id` (`<id>:<base64>`).
pub fn generate_entry(id: &str, rng: &mut dyn rand::RngCore) -> String {
    let mut key = [0u8; KEY_BYTES];
    rng.fill_bytes(&mut key);
    format!("{id}:{}", B64.encode(key))
}

impl Keyring {
    /// `write_id` names the sealing key; `None` takes the first.
    pub fn new(keys: Vec<(String, [u8; KEY_BYTES])>, write_id: Option<&str>) -> Result<Self, SealError> {
        if keys.is_empty() {
            return Err(SealError::NoKeys);
        }
        let mut seen = std::collections::HashSet::new();
        for (id, _) in &keys {
            if !seen.insert(id.as_str()) {
                return Err(SealError::InvalidEntry(format!("key id {id:?} is listed twice")));
            }
        }
        let write = match write_id {
            Some(w) => keys.iter().position(|(id, _)| id == w).ok_or_else(|| SealError::UnknownWriteKey(w.to_owned()))?,
            None => 0,
        };
        let keys = keys.into_iter().map(|(id, k)| (id, Aes256Gcm::new(&k.into()))).collect();
        Ok(Self { keys, write })
    }

    /// From entries as configured (`<id>:<base64>`).
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = &'a str>, write_id: Option<&str>) -> Result<Self, SealError> {
        let keys = entries.into_iter().map(parse_entry).collect::<Result<Vec<_>, _>>()?;
        Self::new(keys, write_id)
    }

    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|(id, _)| id.as_str()).collect()
    }

    pub fn write_key_id(&self) -> &str {
        &self.keys[self.write].0
    }

    /// (key id, nonce ‖ ciphertext ‖ tag).
    pub fn seal(&self, rng: &mut dyn rand::RngCore, aad: &[u8], plaintext: &[u8]) -> (String, Vec<u8>) {
        let (id, cipher) = &self.keys[self.write];
        let mut nonce = [0u8; NONCE_BYTES];
        rng.fill_bytes(&mut nonce);
        // Encryption into a Vec fails only for inputs over GCM's 64 GiB limit; secrets are bounded far below.
        let ct = cipher.encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad }).unwrap_or_default();
        let mut out = Vec::with_capacity(NONCE_BYTES + ct.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        (id.clone(), out)
    }

    pub fn open(&self, key_id: &str, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        let Some((_, cipher)) = self.keys.iter().find(|(id, _)| id == key_id) else {
            return Err(SealError::UnknownKey { key_id: key_id.to_owned(), known: self.ids().join(", ") });
        };
        let wrong = || SealError::WrongKey { key_id: key_id.to_owned() };
        if sealed.len() < NONCE_BYTES {
            return Err(wrong());
        }
        let (nonce, ct) = sealed.split_at(NONCE_BYTES);
        cipher.decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad }).map_err(|_| wrong())
    }
}

/// A custom header's associated data: the subscription and the header's name.
fn header_aad(sub_id: &str, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(sub_id.len() + name.len() + 8);
    aad.extend_from_slice(sub_id.as_bytes());
    aad.extend_from_slice(b"\0header\0");
    aad.extend_from_slice(name.as_bytes());
    aad
}

/// Seals every secret of `sub` that is in the clear (`value` is emptied, `sealed` and `key_id` set), and every
/// custom header (`headers` is emptied into `sealed_headers`, by name).
pub fn seal_secrets(sub: &mut Subscription, keyring: &Keyring, rng: &mut dyn rand::RngCore) {
    for s in sub.secrets.iter_mut().filter(|s| !s.value.is_empty()) {
        let (key_id, sealed) = keyring.seal(rng, sub.id.as_bytes(), s.value.as_bytes());
        s.key_id = key_id;
        s.sealed = sealed.into();
        s.value.clear();
    }
    if sub.headers.is_empty() {
        // Nothing in the clear: what is sealed stays as it is (entries an opening process emptied have no value
        // to keep, and a record is sealed from its opened headers).
        sub.sealed_headers.retain(|h| !h.sealed.is_empty());
        return;
    }
    let mut names: Vec<String> = sub.headers.keys().cloned().collect();
    names.sort();
    sub.sealed_headers = names
        .into_iter()
        .map(|name| {
            let value = sub.headers.remove(&name).unwrap_or_default();
            let (key_id, sealed) = keyring.seal(rng, &header_aad(&sub.id, &name), value.as_bytes());
            SealedHeader { name, sealed: sealed.into(), key_id }
        })
        .collect();
}

/// Opens every sealed secret of `sub` into `value` (and drops the sealed form), and every sealed header into
/// `headers` (keeping its name and key id, its sealed bytes emptied). A secret or header stored in the clear by an
/// earlier version is kept as it is. Anything that does not open is an error: nothing is half-opened.
pub fn open_secrets(sub: &mut Subscription, keyring: &Keyring) -> Result<(), SealError> {
    let mut headers = Vec::with_capacity(sub.sealed_headers.len());
    for h in sub.sealed_headers.iter().filter(|h| !h.sealed.is_empty()) {
        let plain = keyring.open(&h.key_id, &header_aad(&sub.id, &h.name), &h.sealed)?;
        let value = String::from_utf8(plain).map_err(|_| SealError::WrongKey { key_id: h.key_id.clone() })?;
        headers.push((h.name.clone(), value));
    }
    let mut opened = Vec::with_capacity(sub.secrets.len());
    for s in &sub.secrets {
        if s.key_id.is_empty() && s.sealed.is_empty() {
            opened.push(None);
            continue;
        }
        let plain = keyring.open(&s.key_id, sub.id.as_bytes(), &s.sealed)?;
        let value = String::from_utf8(plain).map_err(|_| SealError::WrongKey { key_id: s.key_id.clone() })?;
        opened.push(Some(value));
    }
    for (s, v) in sub.secrets.iter_mut().zip(opened) {
        if let Some(v) = v {
            s.value = v;
            s.sealed = Default::default();
        }
    }
    sub.headers.extend(headers);
    for h in &mut sub.sealed_headers {
        h.sealed = Default::default();
    }
    Ok(())
}

/// Drops every secret and custom header value of `sub`, sealed or not (a process that never sends).
pub fn drop_secrets(sub: &mut Subscription) {
    sub.secrets.clear();
    sub.sealed_headers.clear();
    sub.headers.clear();
}

/// Whether any secret of `sub` is stored in the clear, or sealed with another key than the keyring's write key
/// (such a record is sealed again when it is rewritten); and the same of its custom headers.
pub fn needs_reseal(sub: &Subscription, keyring: &Keyring) -> bool {
    sub.secrets.iter().any(|s| key_needs_reseal(&s.key_id, keyring)) || headers_need_reseal(sub, keyring)
}

/// Whether a custom header of `sub` was stored in the clear (a value with no sealed entry of its name), or sealed
/// with another key than the write key.
pub fn headers_need_reseal(sub: &Subscription, keyring: &Keyring) -> bool {
    sub.sealed_headers.iter().any(|h| key_needs_reseal(&h.key_id, keyring))
        || sub.headers.keys().any(|name| !sub.sealed_headers.iter().any(|h| h.name == *name))
}

/// [`needs_reseal`] for one secret, by the id of the key that sealed it (empty: stored in the clear).
pub fn key_needs_reseal(key_id: &str, keyring: &Keyring) -> bool {
    key_id.is_empty() || key_id != keyring.write_key_id()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Secret;
    use rand::SeedableRng;

    fn ring(entries: &[&str], write: Option<&str>) -> Keyring {
        Keyring::from_entries(entries.iter().copied(), write).unwrap()
    }

    fn sub(secret: &str) -> Subscription {
        Subscription { id: "sub_1".into(), secrets: vec![Secret { value: secret.into(), ..Default::default() }], ..Default::default() }
    }

    #[test]
    fn a_sealed_secret_opens_with_its_key_and_leaves_nothing_in_the_clear() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let k1 = generate_entry("k1", &mut rng);
        let keys = ring(&[&k1], None);
        let mut s = sub("whsec_topsecret");
        seal_secrets(&mut s, &keys, &mut rng);
        assert!(s.secrets[0].value.is_empty());
        assert_eq!(s.secrets[0].key_id, "k1");
        let encoded = prost::Message::encode_to_vec(&s);
        assert!(!encoded.windows(9).any(|w| w == b"topsecret"), "no plaintext in the record");
        assert!(!needs_reseal(&s, &keys));
        open_secrets(&mut s, &keys).unwrap();
        assert_eq!(s.secrets[0].value, "whsec_topsecret");
        assert!(s.secrets[0].sealed.is_empty());
    }

    #[test]
    fn rotation_reads_old_records_and_writes_with_the_new_key() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let (old, new) = (generate_entry("old", &mut rng), generate_entry("new", &mut rng));
        let mut s = sub("whsec_a");
        seal_secrets(&mut s, &ring(&[&old], None), &mut rng);
        let both = ring(&[&old, &new], Some("new"));
        assert!(needs_reseal(&s, &both));
        let mut read = s.clone();
        open_secrets(&mut read, &both).unwrap();
        assert_eq!(read.secrets[0].value, "whsec_a");
        seal_secrets(&mut read, &both, &mut rng);
        assert_eq!(read.secrets[0].key_id, "new");
        // Once every record is sealed with the new key, the old one can go.
        open_secrets(&mut read, &ring(&[&new], None)).unwrap();
        assert_eq!(read.secrets[0].value, "whsec_a");
    }

    #[test]
    fn a_missing_or_wrong_key_or_another_subscription_is_an_error_never_garbage() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let k1 = generate_entry("k1", &mut rng);
        let mut s = sub("whsec_b");
        seal_secrets(&mut s, &ring(&[&k1], None), &mut rng);
        let other = generate_entry("k2", &mut rng);
        let e = open_secrets(&mut s.clone(), &ring(&[&other], None)).unwrap_err();
        assert!(matches!(e, SealError::UnknownKey { .. }), "{e}");
        assert!(e.to_string().contains("\"k1\""), "{e}");
        // Same id, different key material.
        let impostor = generate_entry("k1", &mut rng);
        let mut c = s.clone();
        assert_eq!(open_secrets(&mut c, &ring(&[&impostor], None)), Err(SealError::WrongKey { key_id: "k1".into() }));
        assert!(c.secrets[0].value.is_empty(), "nothing half-opened");
        let mut moved = s.clone();
        moved.id = "sub_2".into();
        assert!(open_secrets(&mut moved, &ring(&[&k1], None)).is_err());
        let mut cut = s.clone();
        cut.secrets[0].sealed = cut.secrets[0].sealed.slice(..5);
        assert!(open_secrets(&mut cut, &ring(&[&k1], None)).is_err());
    }

    #[test]
    fn a_clear_secret_of_an_earlier_version_is_read_as_it_is() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let keys = ring(&[&generate_entry("k", &mut rng)], None);
        let mut s = sub("whsec_legacy");
        assert!(needs_reseal(&s, &keys));
        open_secrets(&mut s, &keys).unwrap();
        assert_eq!(s.secrets[0].value, "whsec_legacy");
    }

    #[test]
    fn custom_headers_are_sealed_by_name_and_open_only_where_they_were_sealed() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let (old, new) = (generate_entry("old", &mut rng), generate_entry("new", &mut rng));
        let mut s = sub("whsec_c");
        s.headers.insert("Authorization".into(), "Bearer partner-token".into());
        s.headers.insert("X-Custom-Cred".into(), "cred-value-123".into());
        assert!(needs_reseal(&s, &ring(&[&old], None)), "headers in the clear");
        seal_secrets(&mut s, &ring(&[&old], None), &mut rng);
        assert!(s.headers.is_empty());
        assert_eq!(s.sealed_headers.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(), ["Authorization", "X-Custom-Cred"]);
        let encoded = prost::Message::encode_to_vec(&s);
        for plain in [&b"partner-token"[..], b"cred-value-123"] {
            assert!(!encoded.windows(plain.len()).any(|w| w == plain), "no header value in the record");
        }
        // Opened, the values are back and the entries keep only which key sealed them.
        let both = ring(&[&old, &new], Some("new"));
        let mut read = s.clone();
        open_secrets(&mut read, &both).unwrap();
        assert_eq!(read.headers.get("X-Custom-Cred").map(String::as_str), Some("cred-value-123"));
        assert!(read.sealed_headers.iter().all(|h| h.sealed.is_empty() && h.key_id == "old"));
        assert!(headers_need_reseal(&read, &both), "sealed with the old key");
        seal_secrets(&mut read, &both, &mut rng);
        assert!(!needs_reseal(&read, &both));
        open_secrets(&mut read, &ring(&[&new], None)).unwrap();
        assert_eq!(read.headers.get("Authorization").map(String::as_str), Some("Bearer partner-token"));
        // A value moved under another header's name, or into another subscription, does not open.
        let mut swapped = s.clone();
        swapped.sealed_headers[0].name = "X-Other".into();
        assert!(open_secrets(&mut swapped, &ring(&[&old], None)).is_err());
        let mut moved = s.clone();
        moved.id = "sub_2".into();
        assert!(open_secrets(&mut moved, &ring(&[&old], None)).is_err());
        // A record of an earlier version with clear headers reads as it is, and needs sealing.
        let mut legacy = sub("whsec_d");
        legacy.secrets.clear();
        legacy.headers.insert("X-Api-Key".into(), "k".into());
        open_secrets(&mut legacy, &both).unwrap();
        assert_eq!(legacy.headers.get("X-Api-Key").map(String::as_str), Some("k"));
        assert!(needs_reseal(&legacy, &both));
        drop_secrets(&mut legacy);
        assert!(legacy.headers.is_empty() && legacy.secrets.is_empty());
    }

    #[test]
    fn entries_are_checked_without_quoting_the_key() {
        assert!(parse_entry("nocolon").is_err());
        assert!(parse_entry(":AAAA").is_err());
        assert!(parse_entry("a b:AAAA").is_err());
        let e = parse_entry("k:c2hvcnQ=").unwrap_err().to_string();
        assert!(e.contains("5 bytes"), "{e}");
        let e = parse_entry("k:not*base64").unwrap_err().to_string();
        assert!(!e.contains("not*base64"), "{e}");
        assert!(Keyring::from_entries(Vec::<&str>::new(), None).is_err());
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let a = generate_entry("a", &mut rng);
        assert!(matches!(Keyring::from_entries([a.as_str()], Some("b")), Err(SealError::UnknownWriteKey(_))));
        assert!(Keyring::from_entries([a.as_str(), a.as_str()], None).is_err());
        let dbg = format!("{:?}", ring(&[&a], None));
        assert!(!dbg.contains(a.split_once(':').unwrap().1), "{dbg}");
    }
}
