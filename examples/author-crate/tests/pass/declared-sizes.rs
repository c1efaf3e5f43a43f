// The sizes each architecture declares keep compiling.
fn tensor<A: headcount::SupportsTensorParallel<N>, const N: usize>() {}
fn pipeline<A: headcount::SupportsPipelineParallel<N>, const N: usize>() {}

fn main() {
    tensor::<my_architectures::Glm4_9B, 2>();
    tensor::<my_architectures::Glm4_32B, 8>();
    pipeline::<my_architectures::Glm4_32B, 4>();
    pipeline::<my_architectures::Small12, 3>();
}
