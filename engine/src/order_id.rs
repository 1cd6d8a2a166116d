//! Order ids that route. `pay`, `cancel` and the order lookup get nothing but
//! the id, so the id itself says where the order lives: the SKU (which sale,
//! hence its buckets' tags) and the bucket that served it (hence the slot),
//! then 128 random bits, so an id is unguessable and says nothing about how
//! many orders a process made: `<sku>~<bucket>~<32 hex digits>`. `~` is not
//! a SKU character and needs no escaping in a URL path.

use crate::error::InvalidInput;
use crate::validate;

/// The random part of an order id, drawn once per purchase: every bucket
/// the purchase may be served by names its order with the same nonce.
pub(crate) fn new_nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The id of the order `bucket` of `sku` makes for a purchase whose nonce is
/// `nonce`.
pub(crate) fn compose(sku: &str, bucket: u32, nonce: &str) -> String {
    format!("{sku}~{bucket}~{nonce}")
}

/// Where an order lives, read from its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderRoute<'a> {
    /// The sale.
    pub sku: &'a str,
    /// The bucket that served the order.
    pub bucket: u32,
}

/// Longest order id: a 64-byte SKU, a bucket index, 32 hex digits.
const MAX_LEN: usize = 64 + 1 + 10 + 1 + 32;

/// Reads the route out of an order id, or says what is wrong with it.
pub fn route(order_id: &str) -> Result<OrderRoute<'_>, InvalidInput> {
    let bad = |expected: &'static str| InvalidInput::Malformed {
        field: "order_id",
        expected,
    };
    if order_id.is_empty() {
        return Err(InvalidInput::Empty("order_id"));
    }
    if order_id.len() > MAX_LEN {
        return Err(InvalidInput::TooLong {
            field: "order_id",
            len: order_id.len(),
            max: MAX_LEN,
        });
    }
    const SHAPE: &str = "an order id is <sku>~<bucket>~<32 hex digits>";
    let mut parts = order_id.rsplitn(3, '~');
    let (Some(nonce), Some(bucket), Some(sku)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad(SHAPE));
    };
    if nonce.len() != 32
        || !nonce
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(bad(SHAPE));
    }
    if bucket.is_empty() || bucket.len() > 1 && bucket.starts_with('0') {
        return Err(bad(SHAPE));
    }
    let bucket: u32 = bucket.parse().map_err(|_| bad(SHAPE))?;
    validate::sku(sku).map_err(|_| bad(SHAPE))?;
    Ok(OrderRoute { sku, bucket })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_id_names_its_sale_and_bucket_and_nothing_else_parses() {
        let nonce = new_nonce();
        let id = compose("phone-x.2026:red_1", 7, &nonce);
        assert_eq!(
            route(&id),
            Ok(OrderRoute {
                sku: "phone-x.2026:red_1",
                bucket: 7
            })
        );
        for bad in [
            "",
            "sku~1",
            "sku~1~xyz",
            "sku~01~00000000000000000000000000000000",
            "sku~-1~00000000000000000000000000000000",
            "~1~00000000000000000000000000000000",
            "a{b}~1~00000000000000000000000000000000",
            "sku~1~0000000000000000000000000000000A",
            "sku~99999999999~00000000000000000000000000000000",
        ] {
            assert!(route(bad).is_err(), "{bad:?} parsed");
        }
        assert!(route(&"x".repeat(200)).is_err());
    }
}
