//! The waiting room's signed passes (issue #39, first part): a *ticket*
//! names a sale, a user and a place in its line; an *admission token*
//! names a sale and a user admitted to buy until a deadline. Both are
//! HMAC-SHA256 signed with a key from the config and checked without a
//! Redis trip, so the check can run in `serve` or at an edge in front of
//! it. Why a module of its own: the room's storage, `serve` and an edge
//! all check the same bytes, and nothing here touches Redis.
//!
//! A pass is `<key id>.<payload>.<mac>` (payload and MAC base64url): the
//! key id says which key signed it, so keys rotate. After a rotation the
//! previous key still verifies for one admission window, then not at all;
//! a pass it signed that is still needed (a ticket in a long line) is
//! re-signed with the current key by the next status read.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{KeyInit, Mac};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Shortest secret taken: the hash's output size (RFC 2104's advice).
pub const MIN_SECRET_BYTES: usize = 32;

/// Longest sale or user id a pass carries (the engine's own limits are
/// lower); bounds the work an forged pass can ask for.
const MAX_ID_BYTES: usize = 512;

/// Longest pass read: anything longer is refused before decoding.
const MAX_PASS_BYTES: usize = 4 * MAX_ID_BYTES;

/// What a pass is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassKind {
    /// A place in the line (`POST /v1/sales/{sku}/queue` answers one).
    Ticket,
    /// Leave to buy until `until_ms`.
    Admission,
}

impl PassKind {
    fn byte(self) -> u8 {
        match self {
            PassKind::Ticket => b'T',
            PassKind::Admission => b'A',
        }
    }

    fn from_byte(b: u8) -> Option<PassKind> {
        match b {
            b'T' => Some(PassKind::Ticket),
            b'A' => Some(PassKind::Admission),
            _ => None,
        }
    }
}

/// What a pass says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// Ticket or admission.
    pub kind: PassKind,
    /// The sale (its sku).
    pub sale: String,
    /// The user it was given to.
    pub user: String,
    /// The place in the line (1 is first).
    pub place: u64,
    /// When it was signed, ms since the Unix epoch.
    pub issued_ms: u64,
    /// An admission's deadline (ms since the epoch); 0 for a ticket.
    pub until_ms: u64,
}

/// Why a pass was refused. Every variant maps to one answer of the HTTP
/// contract (`invalid_ticket`, or `not_admitted` for an expired admission
/// or a ticket offered as one); none carries the pass or a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PassError {
    /// Not a pass at all (shape, encoding, lengths).
    #[error("the pass is malformed")]
    Malformed,
    /// Signed with a key id this process does not have.
    #[error("the pass names a signing key this server does not know")]
    UnknownKey,
    /// Signed with the previous key, more than one window after rotation.
    #[error("the pass was signed with a retired key")]
    RetiredKey,
    /// The MAC does not match: forged or altered.
    #[error("the pass's signature does not verify")]
    BadSignature,
    /// Another sale's pass.
    #[error("the pass is for another sale")]
    OtherSale,
    /// Another user's pass.
    #[error("the pass is for another user")]
    OtherUser,
    /// A ticket where an admission is needed, or the reverse.
    #[error("the pass is of the wrong kind")]
    WrongKind,
    /// An admission past its deadline.
    #[error("the admission has expired")]
    Expired,
}

/// A signing key: an id (1 to 16 of `A-Z a-z 0-9 _ -`, carried in every
/// pass) and a secret of at least [`MIN_SECRET_BYTES`]. The secret is
/// never printed.
#[derive(Clone)]
pub struct PassKey {
    id: String,
    secret: Vec<u8>,
}

impl std::fmt::Debug for PassKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassKey")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Why a key cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PassKeyError {
    /// The id is empty, too long or has a character outside the set.
    #[error("a signing key's id must be 1 to 16 of A-Z a-z 0-9 _ -")]
    BadId,
    /// The secret is shorter than [`MIN_SECRET_BYTES`].
    #[error("a signing key's secret must be at least {MIN_SECRET_BYTES} bytes")]
    ShortSecret,
    /// The previous key has the current key's id: a pass could not say
    /// which signed it.
    #[error("the previous signing key has the current key's id")]
    SameId,
    /// Only one of the previous key's id and secret is set.
    #[error("room.previous_key_id and room.previous_secret go together")]
    HalfPrevious,
}

impl PassKey {
    /// A key, checked.
    pub fn new(id: &str, secret: &[u8]) -> Result<PassKey, PassKeyError> {
        let id_ok = (1..=16).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !id_ok {
            return Err(PassKeyError::BadId);
        }
        if secret.len() < MIN_SECRET_BYTES {
            return Err(PassKeyError::ShortSecret);
        }
        Ok(PassKey {
            id: id.to_owned(),
            secret: secret.to_vec(),
        })
    }

    /// The key's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length: this cannot fail.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.secret)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        // Domain separation: a MAC of this format is never one of another.
        mac.update(b"flashsale-pass-v1\0");
        mac.update(self.id.as_bytes());
        mac.update(b"\0");
        mac
    }
}

/// The keys a process signs and checks with: the current one, and the one
/// before it with when it was retired.
#[derive(Debug, Clone)]
pub struct PassKeys {
    current: PassKey,
    previous: Option<(PassKey, u64)>,
}

impl PassKeys {
    /// Only `current`.
    pub fn new(current: PassKey) -> PassKeys {
        PassKeys {
            current,
            previous: None,
        }
    }

    /// `current`, and `previous`, retired at `retired_at_ms`: passes it
    /// signed verify until one admission window after that.
    pub fn with_previous(
        current: PassKey,
        previous: PassKey,
        retired_at_ms: u64,
    ) -> Result<PassKeys, PassKeyError> {
        if previous.id == current.id {
            return Err(PassKeyError::SameId);
        }
        Ok(PassKeys {
            current,
            previous: Some((previous, retired_at_ms)),
        })
    }

    /// The current key's id.
    pub fn current_id(&self) -> &str {
        &self.current.id
    }

    /// `pass` signed with the current key.
    pub fn sign(&self, pass: &Pass) -> String {
        let payload = encode(pass);
        let mut mac = self.current.mac();
        mac.update(&payload);
        let tag = mac.finalize().into_bytes();
        format!(
            "{}.{}.{}",
            self.current.id,
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// What `text` says, if a key of these signed it and, for the previous
    /// key, no more than `window_ms` after its retirement at `now_ms`.
    /// Checks the signature only: [`PassKeys::admission`] checks the rest.
    pub fn verify(&self, text: &str, now_ms: u64, window_ms: u64) -> Result<Pass, PassError> {
        if text.len() > MAX_PASS_BYTES {
            return Err(PassError::Malformed);
        }
        let mut parts = text.split('.');
        let (Some(id), Some(payload), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(PassError::Malformed);
        };
        let key = if id == self.current.id {
            &self.current
        } else {
            match &self.previous {
                Some((key, retired)) if key.id == id => {
                    if now_ms > retired.saturating_add(window_ms) {
                        return Err(PassError::RetiredKey);
                    }
                    key
                }
                _ => return Err(PassError::UnknownKey),
            }
        };
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| PassError::Malformed)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| PassError::Malformed)?;
        let mut mac = key.mac();
        mac.update(&payload);
        // Constant time: the MAC is not found byte by byte.
        mac.verify_slice(&tag)
            .map_err(|_| PassError::BadSignature)?;
        decode(&payload).ok_or(PassError::Malformed)
    }

    /// A place in `[0, 2^40)` for `user` in `sale`'s line, the same in
    /// every process with this key and unknowable without it: before a
    /// shuffled start, everyone's place is this, so arriving early or
    /// rejoining buys nothing and nobody can pick a user id for a low one.
    pub fn shuffled_place(&self, sale: &str, user: &str) -> u64 {
        let mut mac = self.current.mac();
        mac.update(b"shuffle\0");
        mac.update(&(sale.len() as u64).to_be_bytes());
        mac.update(sale.as_bytes());
        mac.update(user.as_bytes());
        let out = mac.finalize().into_bytes();
        let mut first = [0u8; 8];
        first[3..].copy_from_slice(&out[..5]);
        u64::from_be_bytes(first)
    }

    /// The admission `text` for `sale` and `user` at `now_ms`: signed by
    /// these keys, an admission (not a ticket), for this sale and user,
    /// and not past its deadline.
    pub fn admission(
        &self,
        text: &str,
        sale: &str,
        user: &str,
        now_ms: u64,
        window_ms: u64,
    ) -> Result<Pass, PassError> {
        let pass = self.verify(text, now_ms, window_ms)?;
        if pass.kind != PassKind::Admission {
            return Err(PassError::WrongKind);
        }
        if pass.sale != sale {
            return Err(PassError::OtherSale);
        }
        if pass.user != user {
            return Err(PassError::OtherUser);
        }
        if now_ms > pass.until_ms {
            return Err(PassError::Expired);
        }
        Ok(pass)
    }
}

/// The `[room]` table: the keys that sign the waiting room's tickets and
/// admission tokens. Every process that serves a room's sale needs the same
/// keys (an edge that checks tokens too). To rotate: move the current key
/// to `previous_*`, set `previous_retired_at_ms` to now, and put a new one
/// in `key_id`/`secret`; the previous key verifies for one admission window
/// more. Secrets are never printed (`Debug` and the redacted config say
/// `<set>`).
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoomKeysConfig {
    /// The current key's id (1-16 of `A-Z a-z 0-9 _ -`); default `k1`.
    pub key_id: Option<String>,
    /// The current key's secret, at least 32 bytes (or
    /// `FLASHSALE_ROOM_SECRET`). Without it, no sale's room can be joined.
    pub secret: Option<String>,
    /// The previous key's id, during a rotation.
    pub previous_key_id: Option<String>,
    /// The previous key's secret.
    pub previous_secret: Option<String>,
    /// When the previous key was retired, ms since the Unix epoch.
    pub previous_retired_at_ms: u64,
}

impl std::fmt::Debug for RoomKeysConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |s: &Option<String>| if s.is_some() { "<set>" } else { "<unset>" };
        f.debug_struct("RoomKeysConfig")
            .field("key_id", &self.key_id)
            .field("secret", &set(&self.secret))
            .field("previous_key_id", &self.previous_key_id)
            .field("previous_secret", &set(&self.previous_secret))
            .field("previous_retired_at_ms", &self.previous_retired_at_ms)
            .finish()
    }
}

impl RoomKeysConfig {
    /// The keys, checked; `None` when no secret is set.
    pub fn keys(&self) -> Result<Option<PassKeys>, PassKeyError> {
        let Some(secret) = &self.secret else {
            return Ok(None);
        };
        let current = PassKey::new(self.key_id.as_deref().unwrap_or("k1"), secret.as_bytes())?;
        match (&self.previous_key_id, &self.previous_secret) {
            (Some(id), Some(prev)) => PassKeys::with_previous(
                current,
                PassKey::new(id, prev.as_bytes())?,
                self.previous_retired_at_ms,
            )
            .map(Some),
            (None, None) => Ok(Some(PassKeys::new(current))),
            _ => Err(PassKeyError::HalfPrevious),
        }
    }

    /// These settings with each secret replaced by `<set>`.
    pub fn redacted(&self) -> RoomKeysConfig {
        let set = |s: &Option<String>| s.as_ref().map(|_| "<set>".to_owned());
        RoomKeysConfig {
            secret: set(&self.secret),
            previous_secret: set(&self.previous_secret),
            ..self.clone()
        }
    }
}

/// The payload: kind, three numbers, then the two ids, each with its
/// length first, so no id can be read as another field.
fn encode(pass: &Pass) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 24 + 4 + pass.sale.len() + pass.user.len());
    out.push(pass.kind.byte());
    out.extend_from_slice(&pass.place.to_be_bytes());
    out.extend_from_slice(&pass.issued_ms.to_be_bytes());
    out.extend_from_slice(&pass.until_ms.to_be_bytes());
    for id in [&pass.sale, &pass.user] {
        let len = u16::try_from(id.len().min(MAX_ID_BYTES)).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&id.as_bytes()[..usize::from(len)]);
    }
    out
}

fn decode(bytes: &[u8]) -> Option<Pass> {
    let (&kind, rest) = bytes.split_first()?;
    let kind = PassKind::from_byte(kind)?;
    let (place, rest) = take_u64(rest)?;
    let (issued_ms, rest) = take_u64(rest)?;
    let (until_ms, rest) = take_u64(rest)?;
    let (sale, rest) = take_id(rest)?;
    let (user, rest) = take_id(rest)?;
    if !rest.is_empty() {
        return None;
    }
    Some(Pass {
        kind,
        sale,
        user,
        place,
        issued_ms,
        until_ms,
    })
}

fn take_u64(b: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = b.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*head), rest))
}

fn take_id(b: &[u8]) -> Option<(String, &[u8])> {
    let (len, rest) = b.split_first_chunk::<2>()?;
    let len = usize::from(u16::from_be_bytes(*len));
    if len > MAX_ID_BYTES || rest.len() < len {
        return None;
    }
    let (id, rest) = rest.split_at(len);
    Some((String::from_utf8(id.to_vec()).ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: u64 = 60_000;

    fn key(id: &str, fill: u8) -> PassKey {
        PassKey::new(id, &[fill; 32]).expect("key")
    }

    fn admission(sale: &str, user: &str, until_ms: u64) -> Pass {
        Pass {
            kind: PassKind::Admission,
            sale: sale.into(),
            user: user.into(),
            place: 7,
            issued_ms: 1_000,
            until_ms,
        }
    }

    #[test]
    fn an_admission_verifies_for_its_sale_and_user_until_its_deadline() {
        let keys = PassKeys::new(key("k1", 1));
        let token = keys.sign(&admission("sku-1", "alice", 61_000));
        assert!(token.starts_with("k1."));
        let pass = keys
            .admission(&token, "sku-1", "alice", 61_000, WINDOW)
            .expect("valid at its deadline");
        assert_eq!(pass.place, 7);
        assert_eq!(
            keys.admission(&token, "sku-2", "alice", 2_000, WINDOW),
            Err(PassError::OtherSale)
        );
        assert_eq!(
            keys.admission(&token, "sku-1", "bob", 2_000, WINDOW),
            Err(PassError::OtherUser)
        );
        assert_eq!(
            keys.admission(&token, "sku-1", "alice", 61_001, WINDOW),
            Err(PassError::Expired)
        );
        let ticket = keys.sign(&Pass {
            kind: PassKind::Ticket,
            until_ms: 0,
            ..admission("sku-1", "alice", 0)
        });
        assert_eq!(
            keys.admission(&ticket, "sku-1", "alice", 2_000, WINDOW),
            Err(PassError::WrongKind)
        );
    }

    #[test]
    fn a_forged_or_altered_pass_is_refused() {
        let keys = PassKeys::new(key("k1", 1));
        let token = keys.sign(&admission("sku-1", "alice", 61_000));
        // Signed by another secret under the same id.
        let forger = PassKeys::new(key("k1", 2));
        let forged = forger.sign(&admission("sku-1", "alice", u64::MAX));
        assert_eq!(
            keys.verify(&forged, 2_000, WINDOW),
            Err(PassError::BadSignature)
        );
        // The payload of one user under another's MAC.
        let other = keys.sign(&admission("sku-1", "bob", 61_000));
        let (_, payload_b) = other.split_once('.').expect("dots");
        let (payload_b, _) = payload_b.split_once('.').expect("dots");
        let parts: Vec<&str> = token.split('.').collect();
        let spliced = format!("{}.{payload_b}.{}", parts[0], parts[2]);
        assert_eq!(
            keys.verify(&spliced, 2_000, WINDOW),
            Err(PassError::BadSignature)
        );
        for bad in [
            "",
            "k1",
            "k1.x",
            "k1.!!.??",
            "k1.a.b.c",
            &"k1.".repeat(2000),
        ] {
            assert!(keys.verify(bad, 2_000, WINDOW).is_err(), "{bad:?}");
        }
        assert_eq!(
            keys.verify(&token.replacen("k1", "k9", 1), 2_000, WINDOW),
            Err(PassError::UnknownKey)
        );
    }

    #[test]
    fn the_previous_key_verifies_for_one_window_after_rotation_and_not_after() {
        let old = PassKeys::new(key("k1", 1));
        let token = old.sign(&admission("sku-1", "alice", u64::MAX));
        let rotated_at = 100_000;
        let keys = PassKeys::with_previous(key("k2", 2), key("k1", 1), rotated_at).expect("keys");
        assert!(keys.verify(&token, rotated_at + WINDOW, WINDOW).is_ok());
        assert_eq!(
            keys.verify(&token, rotated_at + WINDOW + 1, WINDOW),
            Err(PassError::RetiredKey)
        );
        assert!(keys.sign(&admission("s", "u", 1)).starts_with("k2."));
        assert_eq!(
            PassKeys::with_previous(key("k1", 2), key("k1", 1), 0).err(),
            Some(PassKeyError::SameId)
        );
    }

    #[test]
    fn keys_are_checked_and_never_printed() {
        assert_eq!(PassKey::new("", &[1; 32]).err(), Some(PassKeyError::BadId));
        assert_eq!(
            PassKey::new("a.b", &[1; 32]).err(),
            Some(PassKeyError::BadId),
            "a dot would split the pass"
        );
        assert_eq!(
            PassKey::new("k", &[1; 31]).err(),
            Some(PassKeyError::ShortSecret)
        );
        let k = PassKey::new("k", b"S3cret-S3cret-S3cret-S3cret-S3cret").expect("key");
        assert!(!format!("{k:?} {:?}", PassKeys::new(k.clone())).contains("S3cret"));
    }

    #[test]
    fn ids_with_any_bytes_round_trip_and_cannot_be_read_as_other_fields() {
        let keys = PassKeys::new(key("k1", 1));
        let pass = admission("sku.with|odd\0bytes", "ユーザー.1", 5);
        let token = keys.sign(&pass);
        assert_eq!(keys.verify(&token, 0, WINDOW), Ok(pass));
    }
}
