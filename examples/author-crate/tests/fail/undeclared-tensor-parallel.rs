//! expect: E0277
// Loading with a size the declaration did not list is a type error where it is used.
fn needs<A: headcount::SupportsTensorParallel<4>>() {}

fn main() {
    needs::<my_architectures::Glm4_9B>();
}
