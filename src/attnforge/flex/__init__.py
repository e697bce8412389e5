"""FlexAttention kernels built ahead of time: the variant (`variant`), the matrix section and client
declarations (`flex_spec`, `clients`), the builder (`aot_build`, `worker`, `aoti_train`), the wheel
(`package`) and the loader that ships inside it (`runtime`, installed as `attnforge_flex`).
"""
