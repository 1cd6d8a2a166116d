//! Input checks that run before anything reaches Redis, so bad input gets a
//! typed error and changes nothing. Allocation-free: they only look.

use crate::error::InvalidInput;

/// Longest SKU, in bytes.
pub const MAX_SKU_LEN: usize = 64;
/// Longest user id or request id, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// A SKU becomes part of hash tags and key names: 1-64 bytes of
/// `A-Z a-z 0-9 . _ - :` (no braces, which would change the hash tag).
pub fn sku(s: &str) -> Result<(), InvalidInput> {
    if s.is_empty() {
        return Err(InvalidInput::Empty("sku"));
    }
    if s.len() > MAX_SKU_LEN {
        return Err(InvalidInput::TooLong {
            field: "sku",
            len: s.len(),
            max: MAX_SKU_LEN,
        });
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
    {
        return Err(InvalidInput::BadChar {
            field: "sku",
            reason: "A-Z a-z 0-9 . _ - : only",
        });
    }
    Ok(())
}

/// Unicode format characters (general category Cf) and the other
/// default-ignorable code points (Hangul fillers, the combining grapheme
/// joiner, variation selectors): invisible, and some (U+202E) reverse how
/// the text around them is shown, so an id holding one can pass for another
/// in a log or a support tool.
const INVISIBLE_CHARS: &[(char, char)] = &[
    ('\u{034F}', '\u{034F}'),
    ('\u{115F}', '\u{1160}'),
    ('\u{17B4}', '\u{17B5}'),
    ('\u{180B}', '\u{180F}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{FE00}', '\u{FE0F}'),
    ('\u{FFA0}', '\u{FFA0}'),
    ('\u{FFF0}', '\u{FFF8}'),
    // Not default-ignorable, but shown as nothing: the braille blank and
    // the musical null notehead.
    ('\u{2800}', '\u{2800}'),
    ('\u{1D159}', '\u{1D159}'),
    ('\u{E0000}', '\u{E0FFF}'),
    ('\u{00AD}', '\u{00AD}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{202A}', '\u{202E}'),
    ('\u{2060}', '\u{206F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFF9}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
];

fn is_invisible(c: char) -> bool {
    INVISIBLE_CHARS
        .iter()
        .any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// A user id or request id: 1-128 bytes; no spaces, no control characters
/// (Unicode Cc) and no invisible characters (Cf: zero-width, bidi overrides;
/// and the other default-ignorable code points, see `INVISIBLE_CHARS`); in
/// Unicode NFC (checked with `unicode-normalization`), not starting with a
/// combining mark.
pub fn id(field: &'static str, s: &str) -> Result<(), InvalidInput> {
    if s.is_empty() {
        return Err(InvalidInput::Empty(field));
    }
    if s.len() > MAX_ID_LEN {
        return Err(InvalidInput::TooLong {
            field,
            len: s.len(),
            max: MAX_ID_LEN,
        });
    }
    if !id_chars_ok(s) {
        return Err(InvalidInput::BadChar {
            field,
            reason: "no spaces, control or invisible characters",
        });
    }
    if !s.is_ascii() {
        // One id per text: `é` as one character (NFC) and as `e` + U+0301
        // look alike and would be two buyers with two quotas. Refused, not
        // normalised: the id a client sent is the one its key is built
        // from, so a retry of the same bytes is always the same request.
        if !unicode_normalization::is_nfc(s) {
            return Err(InvalidInput::BadChar {
                field,
                reason: "not in Unicode normal form C (send é as one character, not e + U+0301)",
            });
        }
        if s.chars()
            .next()
            .is_some_and(unicode_normalization::char::is_combining_mark)
        {
            return Err(InvalidInput::BadChar {
                field,
                reason: "a combining mark with nothing before it to combine with",
            });
        }
    }
    Ok(())
}

/// No spaces, control or invisible characters. Ids are ASCII nearly always:
/// then a byte is fine if it is printable and not a space (invisible
/// characters are never ASCII), a check the compiler runs many bytes at a
/// time, where the per-character one walks a table of ranges for each.
fn id_chars_ok(s: &str) -> bool {
    if s.is_ascii() {
        return s.bytes().all(|b| (b'!'..=b'~').contains(&b));
    }
    !s.chars()
        .any(|c| c.is_control() || c.is_whitespace() || is_invisible(c))
}

/// A quantity: at least 1 and at most `max`.
pub fn qty(q: i64, max: u32) -> Result<u32, InvalidInput> {
    if q < 1 {
        return Err(InvalidInput::QtyNotPositive(q));
    }
    if q > i64::from(max) {
        return Err(InvalidInput::QtyTooLarge { qty: q, max });
    }
    Ok(q as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two spellings of one text are not two buyers: only the composed one
    /// (NFC) is taken; a combining mark must follow something.
    #[test]
    fn an_id_in_two_unicode_spellings_is_taken_in_one() {
        assert!(id("user", "caf\u{e9}").is_ok());
        assert!(
            id("user", "u\u{308}ber").is_err(),
            "e + U+0301 style: not NFC"
        );
        assert!(matches!(
            id("user", "cafe\u{301}"),
            Err(InvalidInput::BadChar { field: "user", .. })
        ));
        assert!(id("user", "\u{301}abc").is_err(), "a lone combining mark");
        assert!(
            id("user", "\u{1100}\u{1161}").is_err(),
            "Hangul jamo that compose"
        );
        assert!(id("user", "\u{AC00}").is_ok());
    }

    #[test]
    fn skus_that_would_break_hash_tags_are_refused() {
        assert!(sku("phone-x.2026:red_1").is_ok());
        assert!(matches!(sku(""), Err(InvalidInput::Empty("sku"))));
        assert!(matches!(sku("a{b}"), Err(InvalidInput::BadChar { .. })));
        assert!(matches!(
            sku(&"x".repeat(65)),
            Err(InvalidInput::TooLong { .. })
        ));
    }

    #[test]
    fn the_ascii_shortcut_judges_every_ascii_character_as_the_unicode_rule_does() {
        for b in 0u8..=0x7f {
            let c = char::from(b);
            let rule = !(c.is_control() || c.is_whitespace() || is_invisible(c));
            let text = format!("a{c}b");
            assert_eq!(id_chars_ok(&text), rule, "byte {b:#04x}");
            // The same character beside a non-ASCII one takes the other path.
            assert_eq!(id_chars_ok(&format!("é{c}")), rule, "byte {b:#04x}");
        }
        assert!(!id_chars_ok("a\u{200B}b"));
        assert!(!id_chars_ok("a\u{00A0}b"));
        assert!(id_chars_ok("用户-1"));
    }

    #[test]
    fn ids_and_quantities_are_bounded() {
        assert!(id("user", "u-1").is_ok());
        assert!(matches!(
            id("user", "a b"),
            Err(InvalidInput::BadChar { .. })
        ));
        assert!(matches!(
            id("request_id", &"r".repeat(1024)),
            Err(InvalidInput::TooLong { .. })
        ));
        for sneaky in [
            // Invisible but not Cf (found by the attack on serve): default-
            // ignorable fillers, the grapheme joiner, variation selectors.
            "\u{3164}",
            "a\u{115F}b",
            "x\u{034F}",
            "x\u{FE0F}",
            "x\u{FFA0}",
            "x\u{180B}",
            "x\u{E0100}",
            "x\u{2065}",
            "u1\u{FFF0}",
            "u1\u{FFF8}",
            "u1\u{2800}",
            "u1\u{1D159}",
            "a\u{200B}b",
            "evil\u{202E}gnp.exe",
            "\u{FEFF}u",
            "x\u{0007}",
        ] {
            assert!(
                matches!(id("user", sneaky), Err(InvalidInput::BadChar { .. })),
                "{sneaky:?}"
            );
        }
        assert!(
            id("user", "José-東京-🙂").is_ok(),
            "visible unicode is fine"
        );
        assert_eq!(qty(3, 5), Ok(3));
        assert_eq!(qty(0, 5), Err(InvalidInput::QtyNotPositive(0)));
        assert_eq!(qty(-2, 5), Err(InvalidInput::QtyNotPositive(-2)));
        assert!(matches!(
            qty(6, 5),
            Err(InvalidInput::QtyTooLarge { qty: 6, max: 5 })
        ));
    }
}
