//! The README's durable entity: a shopping cart whose events are journaled under its
//! shard's grant, so the cart outlives the node that served it.
//! Run: `cargo run --example durable_cart`

use std::collections::BTreeMap;
use std::error::Error;
use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::TenureConfig;
use tenure::cluster::{ClusterError, ClusterSettings, Node};
use tenure::sharding::{
    Durable, DurableEntity, Effect, EntityContext, ShardRegion, durable_entity_factory,
};
use tenure::sqlite::SqliteJournal;

#[derive(Serialize, Deserialize)]
enum CartCommand {
    Add { item: String, quantity: u32 },
    Checkout,
    Get,
}

#[derive(Serialize, Deserialize)]
enum CartEvent {
    Added { item: String, quantity: u32 },
    CheckedOut,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Cart {
    items: BTreeMap<String, u32>,
    checked_out: bool,
}

struct ShoppingCart;

impl DurableEntity for ShoppingCart {
    type Command = CartCommand;
    type Event = CartEvent;
    type State = Cart;
    type Reply = Result<Cart, String>;

    fn empty_state(&self, _ctx: &EntityContext) -> Cart {
        Cart::default()
    }

    fn on_command(
        &self,
        _ctx: &EntityContext,
        cart: &Cart,
        command: CartCommand,
    ) -> Effect<CartEvent, Cart, Self::Reply> {
        match command {
            CartCommand::Add { .. } | CartCommand::Checkout if cart.checked_out => {
                Effect::reply(Err("the cart is checked out".into()))
            }
            CartCommand::Add { item, quantity } => {
                Effect::persist([CartEvent::Added { item, quantity }], |c: &Cart| {
                    Ok(c.clone())
                })
            }
            CartCommand::Checkout => {
                Effect::persist([CartEvent::CheckedOut], |c: &Cart| Ok(c.clone()))
            }
            CartCommand::Get => Effect::reply(Ok(cart.clone())),
        }
    }

    fn on_event(&self, cart: &mut Cart, event: &CartEvent) {
        match event {
            CartEvent::Added { item, quantity } => {
                *cart.items.entry(item.clone()).or_default() += quantity
            }
            CartEvent::CheckedOut => cart.checked_out = true,
        }
    }
}

/// A one-node cluster on a free loopback port hosting the cart type, its leases and journal
/// in `dir`. A port that another program takes between the look and the bind is replaced.
async fn start(dir: &Path) -> Result<(Node, ShardRegion), Box<dyn Error>> {
    let leases = dir.join("leases.sqlite");
    let mut attempts = 0;
    let (node, provider) = loop {
        let port = free_port()?;
        let config = TenureConfig::from_toml_str(
            &format!(
                "[lease.sqlite]\npath = {leases:?}\nheartbeat-timeout = \"3s\"\nheartbeat-interval = \"500ms\"\n\
                 [cluster]\nport = {port}\nseeds = [\"127.0.0.1:{port}\"]\n\
                 cookie = \"durable-cart-example-0123456789abcdef\"\n[sharding.cart]\nnumber-of-shards = 4"
            ),
            "durable_cart",
        )?;
        let provider = tenure::provider(config.clone())?;
        match Node::builder(ClusterSettings::from_config(&config)?)
            .start(&provider)
            .await
        {
            Ok(node) => break (node, provider),
            Err(ClusterError::Bind { source, .. })
                if source.kind() == ErrorKind::AddrInUse && attempts < 10 =>
            {
                attempts += 1
            }
            Err(e) => return Err(e.into()),
        }
    };
    // The journal lives in the lease file: each append commits with the check of the
    // shard lease's grant.
    let journal = Arc::new(SqliteJournal::open(&leases, Duration::from_secs(5))?);
    let factory = durable_entity_factory(ShoppingCart, journal);
    let region = tenure::sharding::start_on_node(&node, &provider, "cart", Some(factory)).await?;
    Ok((node, region))
}

/// Fills a cart on one node, which leaves; the next node checks the same cart out.
async fn run(dir: &Path) -> Result<(), Box<dyn Error>> {
    let timeout = Duration::from_secs(20);
    let (node, region) = start(dir).await?;
    let cart = region.entity_ref::<Durable<ShoppingCart>>("cart-42");
    // Each reply comes once its event is durable.
    let apples = CartCommand::Add {
        item: "apple".into(),
        quantity: 3,
    };
    cart.ask(&apples, timeout).await??;
    let pear = CartCommand::Add {
        item: "pear".into(),
        quantity: 1,
    };
    let filled = cart.ask(&pear, timeout).await??;
    println!("cart-42 filled on {}: {filled:?}", node.addr());
    node.leave().await?; // hands its shards off

    let (node, region) = start(dir).await?;
    let cart = region.entity_ref::<Durable<ShoppingCart>>("cart-42");
    let after = cart.ask(&CartCommand::Checkout, timeout).await??; // recovered first
    println!("cart-42 checked out on {}: {after:?}", node.addr());
    node.leave().await?;
    Ok(())
}

/// A loopback port free when looked at.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    run(dir.path()).await
}
