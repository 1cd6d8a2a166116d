//! The README example of embedding flashsale, compiled so it stays true.

use flashsale::{Config, Engine, PurchaseError, PurchaseRequest, SaleSpec};

async fn sell() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::connect(Config::default()).await?; // the ops/up topology
    engine
        .create_sale(SaleSpec {
            buckets: 3,
            per_user_limit: 1,
            ..SaleSpec::new("phone-x", 100)
        })
        .await?;

    let req = PurchaseRequest {
        sku: "phone-x",
        user: "alice",
        qty: 1,
        request_id: "alice-7f3a",
    };
    match engine.purchase(req).await {
        Ok(confirmed) => println!(
            "order {} from bucket {}",
            confirmed.order_id, confirmed.bucket
        ),
        Err(PurchaseError::SoldOut) => println!("sold out"),
        Err(PurchaseError::LimitExceeded { limit, .. }) => println!("only {limit} per customer"),
        Err(other) => println!("refused: {other}"),
    }
    Ok(())
}

fn main() {
    let _ = sell;
}
