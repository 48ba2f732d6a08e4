"""Model-level attention (MLA), MLA-BIN (Zhu et al.), section 2.2, Eq. (1)-(4), and section 3.2, Eq. (8).

Pure torch / numpy; no NVFlare. One module per component, each imported from its own home (this package
re-exports nothing). What runs where:

* each site maps its images to feature vectors with a shared encoder and global average pooling, Eq. (2)::

      C_n^t = GAP(Enc(x_n^t; theta_Enc))                          (encoders.encode)

  and sends them to the server, which checks them (:mod:`~feddg.methods.mla.features`) and stacks them into the
  *domain feature bank*;
* the server trains the domain attention module (DAM) to tell which site a vector comes from, Eq. (3) and (8)::

      D^w = SM(FC_2(FC_1(Conv(C_n^t; theta_C); theta_FC1); theta_FC2))       (attention.DomainAttention)
      L_cls = - sum_i d_i log(d_i^p)                                        (attention.train_domain_attention)

* for images of an unseen domain, the DAM's output weights the sites' local models, Eq. (4)::

      G(m) = sum_i D_i^w l_i(m)                    (attention.attention_weights, combination.combine_state_dicts)

The encoder and the DAM draw their initial weights from seeded generators (:mod:`~feddg.methods.mla.seeding`).
No public code exists; each choice the paper leaves open is written down in the module that makes it.
"""
