"""djl_handlers.io"""
