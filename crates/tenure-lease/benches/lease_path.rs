//! The lease machinery's own cost: acquire+release through the Lease API (handle,
//! LeaseActor, lease machine, events) against the same two calls on the store SPI, on the
//! in-memory store, where no I/O hides it. What remains of it on a real store is the
//! ratio `thin_path` reports in each store's bench.
//!
//! Run: `cargo bench -p tenure-lease --bench lease_path`

use std::sync::Arc;
use std::time::Duration;

use tenure_lease::{Lease, LeaseSpec, LeaseStore, MemoryStore};
use tenure_lease_kit::bench::{
    FIGURE_COLUMNS, api_settings, runtime, spi_request, store_acquire_release, thin_path,
};
use tenure_lease_kit::report::Report;

fn main() {
    tenure_lease_kit::bench::answer_test_runner();
    let mut report = Report::new(
        "lease_path",
        "cargo bench -p tenure-lease --bench lease_path",
        &FIGURE_COLUMNS,
    );
    let rt = runtime().expect("runtime");
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let lease = rt.block_on(async {
        let spec = LeaseSpec::new("api", "bench-owner", store.clone(), api_settings());
        Lease::start(spec.expect("settings"))
            .await
            .expect("lease actor")
    });
    let req = spi_request("spi", Duration::from_secs(60));
    let direct_store = store.clone();
    let direct_req = spi_request("direct", Duration::from_secs(60));
    let path = thin_path(&rt, &lease, &store, &req, move || {
        let (store, req) = (direct_store.clone(), direct_req.clone());
        async move { store_acquire_release(store.as_ref(), &req).await }
    });
    let machinery = path.lease_api.saturating_sub(path.direct);
    println!(
        "lease machinery per acquire+release: {machinery:.1?} (Lease API {:.1?} - store SPI {:.1?})",
        path.lease_api, path.direct
    );
    report.row([
        "lease machinery per acquire+release on the memory store (Lease API - store SPI, mean)"
            .to_string(),
        format!("{machinery:.1?}"),
    ]);
    path.add_to(&mut report, "direct (the store SPI by hand)");
    report.finish().expect("the report");
}
