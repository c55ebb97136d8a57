//! Compiles the verbs shim (src/verbs/shim.c) when rdma-core's headers are here, and says so with the
//! `hpcnet_verbs` cfg. Without them the crate builds without native verbs; the module then reports
//! why (`verbs_unavailable()`). Nothing is linked: the shim dlopens libibverbs and librdmacm.
//!
//! `HPCNET_NATIVE_VERBS=no` builds without verbs even where the headers are (the no-headers build,
//! tested); `HPCNET_RDMA_INCLUDE` names another include directory to look in.

use std::path::PathBuf;

const HEADERS: [&str; 2] = ["infiniband/verbs.h", "rdma/rdma_cma.h"];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(hpcnet_verbs)");
    println!("cargo:rerun-if-changed=src/verbs/shim.c");
    println!("cargo:rerun-if-env-changed=HPCNET_NATIVE_VERBS");
    println!("cargo:rerun-if-env-changed=HPCNET_RDMA_INCLUDE");
    if std::env::var("HPCNET_NATIVE_VERBS").as_deref() == Ok("no") {
        return;
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("HPCNET_RDMA_INCLUDE").map(PathBuf::from).into_iter().collect();
    dirs.push(PathBuf::from("/usr/include"));
    dirs.push(PathBuf::from("/usr/local/include"));
    // Watched even while absent (cargo then re-runs this script each build): a machine that gets
    // rdma-core's headers after a first build must not keep a module without verbs.
    for d in &dirs {
        for header in HEADERS {
            println!("cargo:rerun-if-changed={}", d.join(header).display());
        }
    }
    let Some(dir) = dirs.into_iter()
        .find(|d| HEADERS.iter().all(|h| d.join(h).is_file())) else {
        println!("cargo:warning=rdma-core headers not found (libibverbs-dev, librdmacm-dev): no native verbs");
        return;
    };
    cc::Build::new().file("src/verbs/shim.c").include(dir).flag_if_supported("-Wno-unused-parameter")
        .compile("hpcnet_verbs_shim");
    println!("cargo:rustc-cfg=hpcnet_verbs");
}
